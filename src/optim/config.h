#pragma once
// An optimizer config (Optimizer::create, update_graph) taken apart and validated once: the rule,
// the optimizer-wide step options, and the defaults every param group starts from.
#include <memory>

#include "optfuse/optim.h"
#include "optim/rule.h"
#include "optim/step_options.h"

namespace optfuse::optim {

struct ParsedConfig {
  std::unique_ptr<UpdateRule> rule;
  StepOptions step;
  Options defaults;  // the rule's and precision's defaults merged with the config, validated
};

// Throws Error ("optimizer config ...") for a missing or unknown type, bad values, and step
// options a rule cannot take (a sparse-gradient rule takes none).
ParsedConfig parse_config(const Options& config);

}  // namespace optfuse::optim
