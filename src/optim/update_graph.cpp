// update_graph(): what add_param_group + step would compile, without tensors (for `optfuse warmup`).
#include "optfuse/error.h"
#include "optfuse/optim.h"
#include "optim/options.h"
#include "optim/precision.h"
#include "optim/rule.h"
#include "optim/step_control.h"

namespace optfuse {

Graph update_graph(const Options& config, const Options& overrides, DType param, DType grad) {
  if (!config.is_object()) throw Error("optimizer config must be a JSON object, got " + config.dump());
  auto type = config.find("type");
  if (type == config.end() || !type->is_string()) {
    std::string known;
    for (const auto& k : optim::rule_types()) known += (known.empty() ? "" : ", ") + k;
    throw Error("optimizer config needs \"type\" (one of: " + known + ")");
  }
  auto rule = optim::make_rule_for_config(config);
  Options rest = config;
  rest.erase("type");
  rest.erase("rule");
  const optim::StepControl control(optim::take_step_options(&rest));
  optim::reject_step_options(overrides, "param group");
  Options defaults = optim::merge(optim::with_precision_defaults(rule->defaults()), rest,
                                  rule->type(), "optimizer config");
  rule->validate(defaults, "optimizer config");
  optim::validate_precision(defaults, "optimizer config");
  Options group = optim::merge(defaults, overrides, rule->type(), "param group");
  rule->validate(group, "param group");
  optim::validate_precision(group, "param group");
  optim::check_tensor_dtype(param, "param", "param group");
  optim::check_tensor_dtype(grad, "grad", "param group");
  return optim::apply_precision(optim::with_grad_prologue(rule->graph(group), control.prologue()),
                                optim::group_precision(group, param, grad, "param group"));
}

}  // namespace optfuse
