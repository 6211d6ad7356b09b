#include "optim/config.h"

#include "graph/names.h"
#include "optfuse/error.h"
#include "optim/options.h"
#include "optim/precision.h"

namespace optfuse::optim {
namespace {

ParsedConfig parse(const Options& config) {
  check_nesting(config, "optimizer config");  // before anything copies or shows it
  if (!config.is_object())
    throw Error("optimizer config must be a JSON object, got " + message_text(config));
  auto type = config.find("type");
  if (type == config.end() || !type->is_string()) {
    std::string known;
    for (const auto& k : rule_types()) known += (known.empty() ? "" : ", ") + k;
    throw Error("optimizer config needs \"type\" (one of: " + known + ")");
  }
  // The type and option names are checked where they enter (the type here, option names by
  // merge), so that messages, explain output and saved state can show them.
  check_name(type->get<std::string>(), "optimizer config: type");
  ParsedConfig parsed;
  parsed.rule = make_rule_for_config(config);
  Options rest = config;
  rest.erase("type");
  rest.erase("rule");
  parsed.step = take_step_options(&rest);
  if (parsed.rule->sparse_grads() && parsed.step.any())
    throw Error("optimizer config: " + parsed.rule->type() +
                " takes row-sparse gradients; clipping, loss scaling and gradient accumulation "
                "need dense ones and are not supported with it");
  parsed.defaults = merge(with_precision_defaults(parsed.rule->defaults()), rest,
                          parsed.rule->type(), "optimizer config");
  parsed.rule->validate(parsed.defaults, "optimizer config");
  validate_precision(parsed.defaults, "optimizer config");
  return parsed;
}

}  // namespace

ParsedConfig parse_config(const Options& config) {
  try {
    return parse(config);
  } catch (const nlohmann::json::exception& e) {  // e.g. a get<>() of the wrong kind
    throw Error(std::string("optimizer config: ") + e.what());
  }
}

}  // namespace optfuse::optim
