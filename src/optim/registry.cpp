#include <algorithm>
#include <cctype>

#include "graph/names.h"
#include "optfuse/error.h"
#include "optim/rule.h"

namespace optfuse::optim {

// Each built-in rule's factory, defined in its own file.
std::unique_ptr<UpdateRule> make_sgd();
std::unique_ptr<UpdateRule> make_adam(bool decoupled_weight_decay);  // false: Adam, true: AdamW
std::unique_ptr<UpdateRule> make_adagrad();
std::unique_ptr<UpdateRule> make_rmsprop();
std::unique_ptr<UpdateRule> make_adamax();
std::unique_ptr<UpdateRule> make_nadam();
std::unique_ptr<UpdateRule> make_radam();
std::unique_ptr<UpdateRule> make_adadelta();
std::unique_ptr<UpdateRule> make_adafactor();  // factored second moments: staged kernels
std::unique_ptr<UpdateRule> make_asgd();
std::unique_ptr<UpdateRule> make_rprop();
std::unique_ptr<UpdateRule> make_lion();  // not in torch.optim: Chen et al. 2023 / lion-pytorch
// Per-tensor trust ratios from norms (reductions in the same kernel): not in torch.optim.
std::unique_ptr<UpdateRule> make_lamb();         // apex FusedLAMB (adam_w_mode), see lamb.cpp
std::unique_ptr<UpdateRule> make_lars();         // torchlars over SGD, see lars.cpp
std::unique_ptr<UpdateRule> make_sparse_adam();  // torch.optim.SparseAdam
// Two kernels around an opaque orthogonalization (newton_schulz.h): torch.optim.Muon.
std::unique_ptr<UpdateRule> make_muon();

namespace {

// The one list of built-in optimizers: torch's lowercase name, and its factory. An alias is
// accepted by make_rule but not listed by rule_types().
struct Builtin {
  const char* name;
  std::unique_ptr<UpdateRule> (*make)();
  bool alias = false;
};
const Builtin kBuiltins[] = {
    {"adadelta", make_adadelta},
    {"adafactor", make_adafactor},
    {"adagrad", make_adagrad},
    {"adam", [] { return make_adam(false); }},
    {"adamax", make_adamax},
    {"adamw", [] { return make_adam(true); }},
    {"asgd", make_asgd},
    {"lamb", make_lamb},
    {"lars", make_lars},
    {"lion", make_lion},
    {"muon", make_muon},
    {"nadam", make_nadam},
    {"radam", make_radam},
    {"rmsprop", make_rmsprop},
    {"rprop", make_rprop},
    {"sgd", make_sgd},
    {"sparseadam", make_sparse_adam},
    {"lazyadam", make_sparse_adam, true},
};

}  // namespace

std::vector<std::string> rule_types() {
  std::vector<std::string> types;
  for (const Builtin& b : kBuiltins)
    if (!b.alias) types.push_back(b.name);
  for (const std::string& t : registered_types()) types.push_back(t);
  return types;
}

std::string UpdateRule::structure(const Options& h) const {
  const std::optional<std::vector<std::string>> names = graph_options();
  if (!names) return h.dump();
  std::string text;
  for (const std::string& name : *names)
    text += name + "=" + (h.contains(name) ? h.at(name).dump() : "-") + ";";
  return text;
}

std::unique_ptr<UpdateRule> make_rule(const std::string& type) {
  check_name(type, "optimizer type");
  std::string t = type;
  std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const Builtin& b : kBuiltins)
    if (t == b.name) return b.make();
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
