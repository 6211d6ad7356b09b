#pragma once
// Shared pieces of the benchmark suites: one engine per process, reusable float arrays, and
// kernel calls bound by name.
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "optfuse/engine.h"

namespace optfuse::bench {

// The engine every benchmark in the process compiles through (host target, default schedule,
// hardware-concurrency threads), so all fused variants share one thread pool and one schedule.
Engine& engine();

// `count` float arrays of `n` elements for one benchmark run, 64-byte aligned. Storage is kept
// between runs (allocating and faulting in a GiB per run would dominate set-up) and refilled each
// run with positive, well-scaled values: every variant stays finite and free of denormals over
// millions of in-place steps.
class Arrays {
 public:
  Arrays(int count, int64_t n);
  float* operator[](int i) const;
  int64_t size() const { return n_; }

 private:
  int count_;
  int64_t n_;
};

// A call of `k` over `n` elements: tensor pointers and scalar values looked up by the names in
// its signature. Outputs update their input in place unless `out` names another pointer for the
// input they replace. Throws Error naming any input or scalar that is not given.
KernelCall make_call(const Kernel& k, const std::map<std::string, float*>& tensors,
                     const std::map<std::string, double>& scalars, int64_t n,
                     const std::map<std::string, float*>& out = {});

// `<name> <first 16 hex digits of the key> <schedule>` for SetLabel.
std::string label(const Kernel& k);

}  // namespace optfuse::bench
