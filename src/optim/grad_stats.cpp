#include "optim/grad_stats.h"

#include <algorithm>
#include <cmath>

#include "optfuse/error.h"
#include "optim/grad_prologue.h"

namespace optfuse::optim {
namespace {

// A reducing kernel covers at most 2^30 elements per call (engine.h).
constexpr int64_t kMaxCall = int64_t{1} << 30;

GradStats run_tensor(const Kernel& k, const StatsInput& t, KernelCall* call, double* results) {
  const KernelSignature& sig = k.signature();
  const int sumsq = sig.result_index("sumsq"), maxabs = sig.result_index("maxabs");
  GradStats s;
  for (int64_t b = 0; b < t.n; b += kMaxCall) {
    call->inputs.resize(sig.inputs.size());
    for (size_t i = 0; i < sig.inputs.size(); ++i)
      call->inputs[i] =
          sig.inputs[i].role == Role::Grad
              ? static_cast<void*>(const_cast<char*>(static_cast<const char*>(t.grad) +
                                                     b * int64_t(dtype_size(sig.inputs[i].dtype))))
              : static_cast<void*>(const_cast<float*>(t.acc + b));
    call->outputs.clear();
    call->n = std::min(kMaxCall, t.n - b);
    call->results = results;
    k.run(*call);
    s.merge({results[sumsq], maxabs >= 0 ? results[maxabs] : 0.0});
  }
  return s;
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

GradStats grad_stats(const Kernel& kernel, const std::vector<StatsInput>& tensors, WorkerPool* pool,
                     int64_t single_task) {
  if (kernel.signature().result_index("sumsq") < 0) internal_error("not a grad_stats kernel");
  std::vector<GradStats> partial(tensors.size());
  std::vector<size_t> small;
  KernelCall call;
  std::vector<double> results(kernel.signature().results.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i].n <= single_task)
      small.push_back(i);
    else
      partial[i] = run_tensor(kernel, tensors[i], &call, results.data());
  }
  if (!pool || small.size() < 4 * static_cast<size_t>(pool->threads())) {
    for (size_t i : small) partial[i] = run_tensor(kernel, tensors[i], &call, results.data());
  } else {
    const size_t threads = static_cast<size_t>(pool->threads());
    pool->run([&](int part) {
      KernelCall local;
      std::vector<double> res(kernel.signature().results.size());
      size_t p = static_cast<size_t>(part);
      for (size_t j = small.size() * p / threads; j < small.size() * (p + 1) / threads; ++j)
        partial[small[j]] = run_tensor(kernel, tensors[small[j]], &local, res.data());
    });
  }
  GradStats total;
  for (const GradStats& p : partial) total.merge(p);
  return total;
}

}  // namespace optfuse::optim
