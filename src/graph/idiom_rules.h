#pragma once
// The idiom rules of the front end (see include/optfuse/idioms.h), as a rule set for the driver.
#include <vector>

#include "graph/rewrite.h"
#include "optfuse/idioms.h"

namespace optfuse::idioms_detail {

const rewrite::RuleSet& idiom_rule_set();  // the enabled rules, built once
// Rules that hold bit for bit (NaN sign and payload aside) and keep the graph's signature:
// canonicalize() runs them, so every spelling of them is one structural hash.
const rewrite::RuleSet& exact_rule_set();
std::vector<IdiomInfo> idiom_infos();  // every rule, enabled or not, with its summary

}  // namespace optfuse::idioms_detail
