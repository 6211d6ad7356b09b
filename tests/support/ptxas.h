#pragma once
// Compiling graphs for a CUDA target and assembling their PTX with the CUDA toolkit's ptxas, for
// the tests that run without a GPU (test_cuda_ptx, test_cuda_reduce_ptx).
#include <string>
#include <vector>

#include "optfuse/graph.h"

namespace optfuse::testing {

// The object file of `g` compiled for CUDA target `target` with the default GPU schedule.
std::vector<char> cuda_object(const Graph& g, const std::string& target,
                              const std::string& fn_name);

// /usr/local/cuda/bin/ptxas, else ptxas on PATH; "" if neither.
std::string find_ptxas();
// Why a test that assembles PTX skips when find_ptxas() found none.
constexpr const char* kNoPtxas = "ptxas not found (/usr/local/cuda/bin/ptxas or PATH)";

// Runs ptxas `tool` on `ptx` for `arch` (e.g. "sm_80"); returns "" on success, else its output.
std::string ptxas(const std::string& tool, const std::string& ptx, const std::string& arch,
                  const std::string& label);

}  // namespace optfuse::testing
