// update_graph(): what add_param_group + step would compile, without tensors (for `optfuse warmup`).
#include "optfuse/error.h"
#include "optfuse/optim.h"
#include "optim/options.h"
#include "optim/precision.h"
#include "optim/rule.h"

namespace optfuse {

Graph update_graph(const Options& config, const Options& overrides, DType param, DType grad) {
  if (!config.is_object()) throw Error("optimizer config must be a JSON object, got " + config.dump());
  auto type = config.find("type");
  if (type == config.end() || !type->is_string())
    throw Error("optimizer config needs \"type\" (one of: adam, adamw, sgd)");
  auto rule = optim::make_rule(type->get<std::string>());
  Options rest = config;
  rest.erase("type");
  Options defaults = optim::merge(optim::with_precision_defaults(rule->defaults()), rest,
                                  rule->type(), "optimizer config");
  rule->validate(defaults, "optimizer config");
  optim::validate_precision(defaults, "optimizer config");
  Options group = optim::merge(defaults, overrides, rule->type(), "param group");
  rule->validate(group, "param group");
  optim::validate_precision(group, "param group");
  optim::check_tensor_dtype(param, "param", "param group");
  optim::check_tensor_dtype(grad, "grad", "param group");
  return optim::apply_precision(rule->graph(group),
                                optim::group_precision(group, param, grad, "param group"));
}

}  // namespace optfuse
