#pragma once
// Shared pieces of the benchmark suites: one engine per process, reusable float arrays, kernel
// calls bound by name, medians, and the 4-read-3-write ceiling as an optimizer type.
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "optfuse/engine.h"

namespace optfuse::bench {

// The engine every benchmark in the process compiles through (host target, default schedule,
// hardware-concurrency threads), so all fused variants share one thread pool and one schedule.
Engine& engine();

// Float storage of its own, 4096-byte aligned (freed with std::free), for suites that keep arrays
// for longer than one Arrays (e.g. a model's tensors, carved from a few such arrays).
struct FreeFloats {
  void operator()(float* p) const { std::free(p); }
};
using FloatBuffer = std::unique_ptr<float, FreeFloats>;
FloatBuffer allocate_floats(int64_t n);

// The values Arrays gives its array `index`: positive and well-scaled (see Arrays).
void fill_array(float* d, int64_t n, int index);

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

// The median of `v` (the upper one of an even count), as every paired counter reports it.
double median(std::vector<double> v);

using Clock = std::chrono::steady_clock;
inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// An Optimizer::create type whose update is tools/bandwidth.h's 4-read-3-write graph (a custom
// optimizer, registered at the first call; state "exp_avg" and "exp_avg_sq", no scalars): the
// ceiling over a list of tensors through step(), with the step's per-tensor calls and threads.
const std::string& ceiling_optimizer_type();

// `<name> <first 16 hex digits of the key> <schedule>` for SetLabel.
std::string label(const Kernel& k);

}  // namespace optfuse::bench
