#include "optim/group_binding.h"

#include <chrono>
#include <map>
#include <optional>
#include <tuple>
#include <utility>

#include "optfuse/error.h"

namespace optfuse::optim {

namespace {

// One distinct kernel of the group: its graph and the size its schedule is for (-1: default).
struct Wanted {
  const Graph* graph;
  const KernelPlan* plan;
  int64_t size;
};

std::shared_ptr<const Kernel> compile(Engine& engine, const Wanted& w) {
  std::shared_ptr<const Kernel> k =
      w.size >= 0 ? engine.kernel(*w.graph, w.size) : engine.kernel(*w.graph);
  KernelSignature a = w.plan->signature, b = k->signature();
  a.per_row = b.per_row = false;  // (GC adds a row reduction only; a custom graph may have one)
  if (signature_text(a) != signature_text(b))
    internal_error("a tensor kernel's arguments differ from the group's plan kernel's");
  return k;
}

}  // namespace

GroupBinding::GroupBinding(Engine& engine, std::shared_ptr<const GroupPlan> plan,
                           const std::vector<TensorShape>& tensors, bool background)
    : plan_(std::move(plan)) {
  const GroupPlan& p = *plan_;
  const bool by_size = engine.tuned_schedules() > 0;
  // (The graphs live in the plan, which the binding keeps; only the GC one is made here.)
  auto centralized = std::make_shared<std::optional<Graph>>();
  std::vector<Wanted> wanted;
  std::vector<size_t> of_tensor;
  std::map<std::tuple<bool, const KernelPlan*, int64_t>, size_t> index;
  for (const TensorShape& t : tensors) {
    const KernelPlan& kp = p.of(t.numel, t.ndim);
    const bool gc = p.centralized(t.ndim);
    if (gc && !*centralized) *centralized = group_graph(p.recipe, true);
    const int64_t size = by_size ? t.numel : -1;
    auto [it, added] = index.try_emplace({gc, &kp, size}, wanted.size());
    if (added) wanted.push_back({gc ? &**centralized : &kp.graph, &kp, size});
    of_tensor.push_back(it->second);
  }
  kernels_ = std::async(background ? std::launch::async : std::launch::deferred,
                        [&engine, wanted = std::move(wanted), of_tensor = std::move(of_tensor),
                         centralized] {
                          std::vector<std::shared_ptr<const Kernel>> made;
                          for (const Wanted& w : wanted) made.push_back(compile(engine, w));
                          std::vector<std::shared_ptr<const Kernel>> out;
                          for (size_t k : of_tensor) out.push_back(made[k]);
                          return out;
                        })
                 .share();
}

GroupBinding::~GroupBinding() {
  // (A deferred compile that never ran is not started by this.)
  if (kernels_.valid() &&
      kernels_.wait_for(std::chrono::seconds(0)) != std::future_status::deferred)
    kernels_.wait();
}

}  // namespace optfuse::optim
