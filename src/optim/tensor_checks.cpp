#include "optim/tensor_checks.h"

#include <algorithm>

#include "optfuse/error.h"

namespace optfuse::optim {

using Impl = optim::OptimizerState;

void check_tensor(const TensorRef& t, const char* what, const std::string& where) {
  if (t.data == nullptr) throw Error(where + ": " + what + " pointer is null");
  if (t.numel <= 0)
    throw Error(where + ": " + what + " has " + std::to_string(t.numel) +
                " elements (must be > 0)");
  if (!t.shape.empty()) {
    int64_t product = 1;
    std::string dims;
    for (int64_t d : t.shape) {
      if (d < 0) throw Error(where + ": " + what + " shape has a negative dimension");
      product *= d;
      dims += (dims.empty() ? "" : ", ") + std::to_string(d);
    }
    if (product != t.numel)
      throw Error(where + ": " + what + " shape [" + dims + "] has " + std::to_string(product) +
                  " elements but numel is " + std::to_string(t.numel));
  }
}

Span span_of(const TensorRef& t, bool is_param, std::string who) {
  return {reinterpret_cast<uintptr_t>(t.data), end_address(t), is_param, std::move(who)};
}

void check_overlaps(std::vector<Span> spans) {
  std::sort(spans.begin(), spans.end(),
            [](const Span& a, const Span& b) { return a.begin < b.begin; });
  const Span* last_param = nullptr;  // the param reaching furthest so far
  const Span* last_any = nullptr;    // the span of any kind reaching furthest so far
  for (const Span& s : spans) {
    if (last_param && s.begin < last_param->end) {
      if (s.is_param && s.begin == last_param->begin && s.end == last_param->end)
        throw Error(s.who + ": the same param is also " + last_param->who +
                    " (some parameters appear in more than one parameter group)");
      throw Error(s.who + ": " + (s.is_param ? "param" : "grad") +
                  " memory overlaps the param of " + last_param->who);
    }
    if (s.is_param && last_any && s.begin < last_any->end)
      throw Error(s.who + ": param memory overlaps the " + (last_any->is_param ? "param" : "grad") +
                  " of " + last_any->who);
    if (s.is_param && (!last_param || s.end > last_param->end)) last_param = &s;
    if (!last_any || s.end > last_any->end) last_any = &s;
  }
}

std::vector<Span> all_spans(const std::vector<Impl::Group>& groups) {
  std::vector<Span> spans;
  for (size_t gi = 0; gi < groups.size(); ++gi)
    for (size_t ti = 0; ti < groups[gi].tensors.size(); ++ti) {
      const ParamRef& r = groups[gi].tensors[ti].ref;
      spans.push_back(span_of(r.param, true, Impl::where(gi, ti, r)));
      spans.push_back(span_of(r.grad, false, Impl::where(gi, ti, r)));
    }
  return spans;
}

// Gradient centralization needs to know which tensors have >= 2 dims.
void check_gc_shapes(const Options& options, const std::vector<Impl::Tensor>& tensors,
                     size_t group) {
  if (!options.value("grad_centralization", false)) return;
  for (size_t ti = 0; ti < tensors.size(); ++ti)
    if (tensors[ti].ref.param.shape.empty())
      throw Error(Impl::where(group, ti, tensors[ti].ref) +
                  ": grad_centralization needs the param's shape (TensorRef::shape) to find its "
                  "rows; none was given");
}

}  // namespace optfuse::optim
