#pragma once
// Model specs for `optfuse warmup` (format: examples/specs/README.md): the optimizer as
// torch.optim names it, param groups with overrides, and parameters with name, shape and dtype.
#include <cstdint>
#include <string>
#include <vector>

#include "optfuse/optim.h"

namespace optfuse::tools {

struct ModelSpec {
  struct Param {
    std::string name;
    std::vector<int64_t> shape;
    DType dtype = DType::F32;       // "dtype": float32 (default), bfloat16 or float16
    DType grad_dtype = DType::F32;  // "grad_dtype": default the param's (as autograd makes it)
    int64_t numel = 1;
  };
  struct Group {
    Options overrides;           // group options other than "params" / "match"
    std::vector<size_t> params;  // indices into ModelSpec::params
  };
  std::string path;
  std::string model;  // "model" field, else the file name
  Options optimizer;  // {"type": ..., defaults...}
  std::vector<Param> params;
  std::vector<Group> groups;
};

// Reads and checks a spec; Error naming the file and the field at fault.
ModelSpec load_spec(const std::string& path);

// The update graphs group `gi` runs and the params (indices into ModelSpec::params) each serves:
// one graph, or with "grad_centralization" on, the centralized graph for params with >= 2 dims
// and the plain one for the others, or with "state_dtype": "int8" the 8-bit graph for params of
// at least min_8bit_size elements and the f32-state one for the others, or for Adafactor the
// factored graph for params with >= 2 dims and the vector one for the others (as Optimizer::step
// binds them), for the group's param and grad dtypes. Error naming the group, or the param whose
// dtypes differ from the group's first (one group has one param dtype and one grad dtype, as in
// Optimizer::add_param_group).
struct GroupGraph {
  Graph graph{""};
  std::vector<size_t> params;
};
std::vector<GroupGraph> group_graphs(const ModelSpec& spec, size_t gi);

// The kernels `engine` compiles for one group graph, by kernel key, with the params each serves:
// one kernel, or with tuned schedules one per schedule its tensors' sizes get (as the Optimizer
// asks for them). `warmup` compiles these and `explain` prints them, so their keys agree.
struct SpecKernel {
  std::string key;
  int64_t size_hint = 0;  // a tensor size it serves, for Engine::precompile(g, n); 0 = default
  std::vector<size_t> params;
};
std::vector<SpecKernel> spec_kernels(const ModelSpec& spec, const GroupGraph& gg,
                                     const Engine& engine);

}  // namespace optfuse::tools
