#pragma once
// Paired measurements of two kernels of the same graph (internal to src/tune).
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "optfuse/engine.h"

namespace optfuse::tune_detail {

// Buffers for every tensor input of a signature at `n` elements, 64-byte aligned, filled with
// values that stay finite and normal over many in-place steps (params 0.5, grads 1e-3, state
// 0.01), and the in-place call over them with every scalar 0.5.
class Workload {
 public:
  Workload(const KernelSignature& sig, int64_t n);
  const KernelCall& call() const { return call_; }
  int64_t bytes_per_call() const { return bytes_; }  // reads + writes

 private:
  std::vector<std::unique_ptr<char, void (*)(void*)>> buffers_;
  std::vector<double> results_;  // for graphs with results (reductions)
  KernelCall call_;
  int64_t bytes_ = 0;
};

struct PairedResult {
  double ratio = 0;         // median over pairs of t(base) / t(candidate)
  double base_seconds = 0;  // median call times
  double candidate_seconds = 0;
  int pairs = 0;
};

// Calls `base` and `candidate` alternately (the first of each pair swapped every pair) until at
// least `min_pairs` pairs and `seconds` of calls; both kernels must have `work`'s signature.
PairedResult measure_pair(const Kernel& base, const Kernel& candidate, const Workload& work,
                          int min_pairs, double seconds);

// What tune() measures pairs with: measure_pair, unless a test put another here to give the
// search known ratios (tests/test_schedules.cpp). Returns the one it replaces.
using PairMeasure =
    std::function<PairedResult(const Kernel& base, const Kernel& candidate, const Workload& work,
                               int min_pairs, double seconds)>;
PairMeasure set_pair_measure(PairMeasure measure);
PairedResult measure_pair_for_tune(const Kernel& base, const Kernel& candidate,
                                   const Workload& work, int min_pairs, double seconds);

}  // namespace optfuse::tune_detail
