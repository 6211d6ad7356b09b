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

Graph build(const Options& config, const Options& overrides, DType param, DType grad,
            int64_t numel) {
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
  const optim::Blocking blocking = optim::group_blocking(group);
  const bool blocked = blocking.on() && (numel == 0 || blocking.applies(numel));
  // (Refused for the whole group, as Optimizer::step refuses it: plan_group.)
  if (blocking.on() && (rule.sparse_grads() || group.value("grad_centralization", false)))
    throw Error("param group: state_dtype \"int8\" is not supported with " +
                std::string(rule.sparse_grads() ? "sparse gradients" : "grad_centralization"));
  // (The graph of a tensor that gradient centralization applies to, as warm-up specs ask.)
  return optim::group_graph({&rule, group, precision, control.prologue()}, true, blocked);
}

}  // namespace

Graph update_graph(const Options& config, const Options& overrides, DType param, DType grad,
                   int64_t numel) {
  try {
    return build(config, overrides, param, grad, numel);
  } catch (const nlohmann::json::exception& e) {  // as parse_config (src/optim/config.cpp)
    throw Error(std::string("update_graph: ") + e.what());
  }
}

}  // namespace optfuse
