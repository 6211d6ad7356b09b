#include "tune/measure.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "optfuse/error.h"

namespace optfuse::tune_detail {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_of(const Kernel& k, const KernelCall& call) {
  auto t0 = Clock::now();
  k.run(call);
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

float fill_value(Role role) {
  switch (role) {
    case Role::Param:
      return 0.5f;
    case Role::Grad:
      return 1e-3f;
    case Role::State:
    case Role::RowState:
    case Role::ColState:
      return 0.01f;
  }
  return 0.0f;
}

}  // namespace

Workload::Workload(const KernelSignature& sig, int64_t n) {
  call_.n = n;
  for (const auto& in : sig.inputs) {
    size_t bytes = (static_cast<size_t>(n) * dtype_size(in.dtype) + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, std::max<size_t>(bytes, 64));
    if (!p)
      throw Error("tune: cannot allocate " + std::to_string(bytes) + " bytes for \"" + in.name +
                  "\"");
    buffers_.emplace_back(static_cast<char*>(p), std::free);
    if (in.dtype == DType::F32)
      std::fill_n(static_cast<float*>(p), n, fill_value(in.role));
    else
      std::memset(p, 0, bytes);  // zero is a normal value in every dtype
    call_.inputs.push_back(p);
    bytes_ += n * static_cast<int64_t>(dtype_size(in.dtype));
  }
  for (const auto& out : sig.outputs) {
    int i = sig.input_index(out.replaces);
    call_.outputs.push_back(call_.inputs.at(static_cast<size_t>(i)));
    bytes_ += n * static_cast<int64_t>(dtype_size(out.dtype));
  }
  call_.scalars.assign(sig.scalars.size(), 0.5);
  // Graphs with reductions: rows of 1024 elements (or one row when n is not a multiple of it),
  // and somewhere to write the results.
  if (sig.per_row) call_.cols = n % 1024 == 0 ? 1024 : n;
  results_.assign(sig.results.size(), 0.0);
  if (!results_.empty()) call_.results = results_.data();
}

PairedResult measure_pair(const Kernel& base, const Kernel& candidate, const Workload& work,
                          int min_pairs, double seconds) {
  const KernelCall& call = work.call();
  base.run(call);  // warm: first calls fault pages in and wake the thread pool
  candidate.run(call);
  std::vector<double> ratios, tb, tc;
  double spent = 0;
  for (int i = 0; i < min_pairs || spent < seconds; ++i) {
    double b, c;
    if (i % 2 == 0) {
      b = seconds_of(base, call);
      c = seconds_of(candidate, call);
    } else {
      c = seconds_of(candidate, call);
      b = seconds_of(base, call);
    }
    tb.push_back(b);
    tc.push_back(c);
    ratios.push_back(b / std::max(c, 1e-12));
    spent += b + c;
    if (i > 100000) break;  // a guard for a clock that does not move
  }
  return {median(ratios), median(tb), median(tc), static_cast<int>(ratios.size())};
}

namespace {
PairMeasure& pair_measure() {
  static PairMeasure measure = measure_pair;
  return measure;
}
}  // namespace

PairMeasure set_pair_measure(PairMeasure measure) {
  PairMeasure old = std::move(pair_measure());
  pair_measure() = measure ? std::move(measure) : PairMeasure(measure_pair);
  return old;
}

PairedResult measure_pair_for_tune(const Kernel& base, const Kernel& candidate,
                                   const Workload& work, int min_pairs, double seconds) {
  return pair_measure()(base, candidate, work, min_pairs, seconds);
}

}  // namespace optfuse::tune_detail
