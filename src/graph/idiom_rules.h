#pragma once
// The idiom rules of the front end (see include/optfuse/idioms.h), as a rule set for the driver.
#include <vector>

#include "graph/rewrite.h"
#include "optfuse/idioms.h"

namespace optfuse::idioms_detail {

const rewrite::RuleSet& idiom_rule_set();  // the enabled rules, built once
std::vector<IdiomInfo> idiom_infos();      // every rule, enabled or not, with its summary

}  // namespace optfuse::idioms_detail
