#include <algorithm>
#include <cctype>

#include "graph/names.h"
#include "optfuse/error.h"
#include "optim/rule.h"

namespace optfuse::optim {

std::vector<std::string> rule_types() {
  std::vector<std::string> types = {"adagrad", "adam",  "adamax", "adamw",   "lamb", "lars",
                                    "lion",    "nadam", "radam",  "rmsprop", "sgd",  "sparseadam"};
  for (const std::string& t : registered_types()) types.push_back(t);
  return types;
}

std::unique_ptr<UpdateRule> make_rule(const std::string& type) {
  check_name(type, "optimizer type");
  std::string t = type;
  std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return std::tolower(c); });
  if (t == "sgd") return make_sgd();
  if (t == "adam") return make_adam(false);
  if (t == "adamw") return make_adam(true);
  if (t == "adagrad") return make_adagrad();
  if (t == "rmsprop") return make_rmsprop();
  if (t == "adamax") return make_adamax();
  if (t == "nadam") return make_nadam();
  if (t == "radam") return make_radam();
  if (t == "lion") return make_lion();
  if (t == "lamb") return make_lamb();
  if (t == "lars") return make_lars();
  if (t == "sparseadam" || t == "lazyadam") return make_sparse_adam();
  if (auto custom = make_registered_rule(t)) return custom;
  std::string known;
  for (const auto& k : rule_types()) known += (known.empty() ? "" : ", ") + k;
  throw Error("unknown optimizer type '" + type + "' (known: " + known + ")");
}

}  // namespace optfuse::optim

namespace optfuse {

std::vector<std::string> optimizer_types() { return optim::rule_types(); }
Options optimizer_defaults(const std::string& type) { return optim::make_rule(type)->defaults(); }

}  // namespace optfuse
