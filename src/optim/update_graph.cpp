// update_graph(): what add_param_group + step would compile, without tensors (for `optfuse
// warmup`).
#include "optfuse/error.h"
#include "optfuse/optim.h"
#include "optim/config.h"
#include "optim/group_plan.h"
#include "optim/options.h"
#include "optim/precision.h"
#include "optim/rule.h"
#include "optim/step_control.h"

namespace optfuse {

namespace {

Graph build(const Options& config, const Options& overrides, DType param, DType grad, int64_t numel,
            int ndim) {
  optim::ParsedConfig parsed = optim::parse_config(config);
  const optim::UpdateRule& rule = *parsed.rule;
  const optim::StepControl control(parsed.step);
  optim::reject_step_options(overrides, "param group");
  Options group = optim::merge(parsed.defaults, overrides, rule.type(), "param group");
  rule.validate(group, "param group");
  optim::validate_precision(group, "param group");
  optim::check_tensor_dtype(param, "param", "param group");
  optim::check_tensor_dtype(grad, "grad", "param group");
  const optim::Precision precision = optim::group_precision(group, param, grad, "param group");
  const optim::GraphRecipe recipe{&rule, group, precision, control.prologue()};
  const optim::Blocking blocking = optim::group_blocking(group);
  // (Refused for the whole group, as Optimizer::step refuses it.)
  if (blocking.on())
    optim::check_blockable(recipe, optim::group_graph(recipe, false), "param group");
  const bool blocked = blocking.on() && (numel == 0 || blocking.applies(numel));
  // (The graph of a tensor that gradient centralization applies to, as warm-up specs ask; a
  // factored rule's graph for matrices.)
  const bool factored = ndim >= 2 && rule.factored_graph(group);
  return optim::group_graph(recipe, true, blocked && !factored, factored);
}

}  // namespace

Graph update_graph(const Options& config, const Options& overrides, DType param, DType grad,
                   int64_t numel, int ndim) {
  try {
    return build(config, overrides, param, grad, numel, ndim);
  } catch (const nlohmann::json::exception& e) {  // as parse_config (src/optim/config.cpp)
    throw Error(std::string("update_graph: ") + e.what());
  }
}

}  // namespace optfuse
