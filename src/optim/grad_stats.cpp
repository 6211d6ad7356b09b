#include "optim/grad_stats.h"

#include <algorithm>
#include <cmath>

#include "optfuse/error.h"
#include "optim/grad_prologue.h"

namespace optfuse::optim {
namespace {

// Slices of whole vectors (a multiple of every vector width), the update round's size
// (step_round.cpp): a tensor of up to this many elements is one slice.
constexpr int64_t kSliceElems = int64_t{1} << 17;
// A thread claims consecutive slices of at least this many elements at a time.
constexpr int64_t kClaimElems = 16384;

using Slice = StatsRound::Slice;

// One slice's statistics: a serial call (the reduction's single-task loop, on this thread).
GradStats run_slice(const Slice& s, KernelCall* call) {
  const Kernel& k = *s.tensor->kernel;
  const KernelSignature& sig = k.signature();
  const int sumsq = sig.result_index("sumsq"), maxabs = sig.result_index("maxabs");
  if (sumsq < 0 || sig.results.size() > 2) internal_error("not a grad_stats kernel");
  double results[2] = {0, 0};
  call->inputs.resize(sig.inputs.size());
  for (size_t i = 0; i < sig.inputs.size(); ++i)
    call->inputs[i] = sig.inputs[i].role == Role::Grad
                          ? static_cast<void*>(const_cast<char*>(
                                static_cast<const char*>(s.tensor->grad) +
                                s.begin * int64_t(dtype_size(sig.inputs[i].dtype))))
                          : static_cast<void*>(const_cast<float*>(s.tensor->acc + s.begin));
  call->outputs.clear();
  call->n = s.n;
  call->results = results;
  call->serial = true;
  k.run(*call);
  return {results[sumsq], maxabs >= 0 ? results[maxabs] : 0.0};
}

}  // namespace

bool GradStats::finite() const { return std::isfinite(sumsq); }

void GradStats::merge(const GradStats& part) {
  sumsq += part.sumsq;
  if (std::isnan(part.maxabs) || part.maxabs > maxabs) maxabs = part.maxabs;
}

double GradStats::total_norm(bool norm_inf) const {
  if (!norm_inf || !finite()) return std::sqrt(sumsq);  // sqrt(nan) = nan, sqrt(inf) = inf
  return maxabs;
}

Graph grad_stats_graph(bool accumulated, bool want_maxabs, DType grad) {
  Graph gr(std::string("grad_stats") + (accumulated ? "_acc" : "") + (want_maxabs ? "_inf" : "") +
           (grad == DType::F32 ? "" : "_g" + std::string(dtype_name(grad))));
  Value x = gr.grad("grad", grad);
  if (grad != DType::F32) x = cast(x, DType::F32);
  if (accumulated) x = gr.state(kGradAccum) + x;         // the float32 sum the update kernel forms
  gr.result("sumsq", sum_squares(cast(x, DType::F64)));  // squares and sum in double
  if (want_maxabs) gr.result("maxabs", max_abs(x));
  return gr;
}

GradStats grad_stats(const std::vector<StatsInput>& tensors, WorkerPool* pool,
                     StatsRound* scratch) {
  StatsRound& r = *scratch;
  r.slices.clear();
  for (const StatsInput& t : tensors)
    for (int64_t b = 0; b < t.n; b += kSliceElems)
      r.slices.push_back({&t, b, std::min(kSliceElems, t.n - b)});
  make_claims(
      r.slices.size(), [&](size_t i) { return r.slices[i].n; }, kClaimElems, &r.claims);
  r.partial.assign(r.slices.size(), GradStats{});
  r.lanes.resize(pool ? static_cast<size_t>(pool->threads()) : 1);
  run_claims(pool, r.claims, [&](int k, size_t i) {
    r.partial[i] = run_slice(r.slices[i], &r.lanes[static_cast<size_t>(k)]);
  });
  GradStats total;
  for (const GradStats& p : r.partial) total.merge(p);
  return total;
}

}  // namespace optfuse::optim
