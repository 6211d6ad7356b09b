// Custom optimizers (optim.h): a user's graph served as an UpdateRule. The graph is normalized
// (idioms.h) once per structure; its kernel scalars come from the group's hyperparameters and the
// built-ins (step, betaK, bias_correctionK) through the normalized graph's host formulas.
#include <cctype>
#include <cmath>
#include <mutex>

#include "graph/json.h"
#include "graph/names.h"
#include "optfuse/error.h"
#include "optfuse/idioms.h"
#include "optim/options.h"
#include "optim/precision.h"
#include "optim/rule.h"

namespace optfuse::optim {
namespace {

std::string quoted(const std::string& s) { return "'" + s + "'"; }

// "beta2" -> 2 for prefix "beta"; 0 if `name` is not prefix + a positive number.
size_t suffix_index(const std::string& name, const std::string& prefix) {
  if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) return 0;
  size_t k = 0;
  for (size_t i = prefix.size(); i < name.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(name[i])) || k > 1000) return 0;
    k = k * 10 + static_cast<size_t>(name[i] - '0');
  }
  return k;
}

// The value of graph scalar `name` for a group at `step`; Error naming it if it has none.
double source_value(const Options& h, const std::string& name, int64_t step,
                    const std::string& type) {
  if (auto it = h.find(name); it != h.end()) {
    if (it->is_boolean()) return it->get<bool>() ? 1.0 : 0.0;
    if (it->is_number()) return it->get<double>();
  }
  if (name == "step") return static_cast<double>(step);
  const Options* betas = h.contains("betas") ? &h.at("betas") : nullptr;
  for (const char* prefix : {"beta", "bias_correction"}) {
    size_t k = suffix_index(name, prefix);
    if (k == 0 || !betas || !betas->is_array() || k > betas->size()) continue;
    double b = (*betas)[k - 1].get<double>();
    return std::string(prefix) == "beta" ? b : 1.0 - std::pow(b, static_cast<double>(step));
  }
  throw Error("custom optimizer " + quoted(type) + ": graph scalar " + quoted(name) +
              " is neither a number or bool hyperparameter nor a built-in (step, betaK, "
              "bias_correctionK with K <= the number of betas)");
}

class CustomRule final : public UpdateRule {
 public:
  explicit CustomRule(CustomOptimizer def) : def_(std::move(def)) {}

  const std::string& type() const override { return def_.type; }
  Options defaults() const override { return def_.defaults; }

  void validate(const Options& h, const std::string& where) const override {
    const Options precision = precision_defaults();  // validated by validate_precision
    for (const auto& [name, value] : h.items()) {
      if (value.is_boolean() || precision.contains(name)) continue;
      if (name == "betas") {
        if (!value.is_array()) throw Error(where + ": option 'betas' must be a list of numbers");
        for (size_t i = 0; i < value.size(); ++i) {
          double b = value[i].is_number() ? value[i].get<double>() : NAN;
          if (!(b >= 0 && b < 1))
            throw Error(where + ": Invalid beta parameter at index " + std::to_string(i) + ": " +
                        (value[i].is_number() ? pyfloat(b) : message_text(value[i])));
        }
        continue;
      }
      double v = number(h, name, where);
      if (name == "lr" && v < 0) throw Error(where + ": Invalid learning rate: " + pyfloat(v));
      if (name == "eps" && v < 0) throw Error(where + ": Invalid epsilon value: " + pyfloat(v));
      if (name == "weight_decay" && v < 0)
        throw Error(where + ": Invalid weight_decay value: " + pyfloat(v));
    }
  }

  // The graph is normalized(h)'s, one per CustomOptimizer::structure.
  std::string structure(const Options& h) const override {
    return def_.structure ? def_.structure(h) : "";
  }

  Graph graph(const Options& h) const override { return normalized(h).graph; }

  void scalars(const Options& h, const TensorStep& t,
               std::map<std::string, double>* out) const override {
    const Entry& e = entry(h);
    std::map<std::string, double> source;
    for (const std::string& name : e.source_scalars)
      source[name] = source_value(h, name, t.step, def_.type);
    for (const auto& [name, value] : e.n.kernel_scalars(source)) (*out)[name] = value;
  }

  // Checks the graph for `h` against the rules of optim.h (Error naming what is wrong).
  void check(const Options& h) const {
    const Entry& e = entry(h);
    const std::string what = "custom optimizer " + quoted(def_.type) + ": ";
    int params = 0, grads = 0;
    for (const Node& n : e.source.nodes()) {
      if (n.op == Op::Scalar) source_value(h, n.name, 1, def_.type);
      if (n.op != Op::Input) continue;
      params += n.role == Role::Param;
      grads += n.role == Role::Grad;
      if (n.role == Role::RowState || n.role == Role::ColState)
        throw Error(what + "input " + quoted(n.name) + " is " + std::string(role_name(n.role)) +
                    "; a custom optimizer's state has one value per element");
      if (n.dtype != DType::F32)
        throw Error(what + "input " + quoted(n.name) + " has dtype " +
                    std::string(dtype_name(n.dtype)) + "; optimizer tensors are f32");
    }
    if (params != 1 || grads != 1)
      throw Error(what + "the graph needs exactly one param input and one grad input (has " +
                  std::to_string(params) + " and " + std::to_string(grads) + ")");
    for (const Output& o : e.source.outputs())
      if (e.source.node(e.source.find_input(o.replaces)).role == Role::Grad)
        throw Error(what + "output " + quoted(o.replaces) + " would overwrite the gradient");
  }

 private:
  struct Entry {
    Graph source;
    NormalizedGraph n;
    std::vector<std::string> source_scalars;
  };

  // The normalized graph of `h`'s structure (CustomOptimizer::structure), built once (step() may
  // ask from several threads).
  const Entry& entry(const Options& h) const {
    std::string s = def_.structure ? def_.structure(h) : "";
    std::lock_guard<std::mutex> lock(mu_);
    auto it = cache_.find(s);
    if (it == cache_.end()) {
      if (!def_.graph) throw Error("custom optimizer " + quoted(def_.type) + " has no graph");
      Graph source = def_.graph(h);
      NormalizedGraph n = normalize(source);
      std::vector<std::string> names;
      for (const Node& node : source.nodes())
        if (node.op == Op::Scalar) names.push_back(node.name);
      it = cache_.emplace(s, Entry{std::move(source), std::move(n), std::move(names)}).first;
    }
    return it->second;
  }

  const NormalizedGraph& normalized(const Options& h) const { return entry(h).n; }

  CustomOptimizer def_;
  mutable std::mutex mu_;
  mutable std::map<std::string, Entry> cache_;  // by structure; entries are never removed
};

std::mutex& registry_mutex() {
  static std::mutex mu;
  return mu;
}

std::map<std::string, CustomOptimizer>& registry() {
  static std::map<std::string, CustomOptimizer> r;
  return r;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

}  // namespace

std::unique_ptr<UpdateRule> make_custom_rule(const CustomOptimizer& def) {
  if (def.type.empty()) throw Error("custom optimizer: the type name must not be empty");
  check_name(def.type, "custom optimizer name");
  if (!def.defaults.is_object())
    throw Error("custom optimizer " + quoted(def.type) + ": defaults must be a JSON object");
  for (const auto& [name, value] : def.defaults.items())
    check_name(name, "custom optimizer " + quoted(def.type) + ": option name");
  auto rule = std::make_unique<CustomRule>(def);
  rule->validate(def.defaults, "custom optimizer " + quoted(def.type) + " defaults");
  rule->check(def.defaults);
  return rule;
}

std::unique_ptr<UpdateRule> make_registered_rule(const std::string& type) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto it = registry().find(lower(type));
  if (it == registry().end()) return nullptr;
  return std::make_unique<CustomRule>(it->second);
}

std::vector<std::string> registered_types() {
  std::lock_guard<std::mutex> lock(registry_mutex());
  std::vector<std::string> names;
  for (const auto& entry : registry()) names.push_back(entry.first);
  return names;
}

std::unique_ptr<UpdateRule> make_rule_for_config(const Options& config) {
  const std::string type = config.at("type").get<std::string>();
  auto rule = config.find("rule");
  if (lower(type) == "custom") {
    if (rule == config.end())
      throw Error("optimizer config: type \"custom\" needs \"rule\" (name, defaults, graph)");
    return make_custom_rule(custom_optimizer_from_json(*rule));
  }
  if (rule != config.end())
    throw Error("optimizer config: \"rule\" is only for type \"custom\", not \"" + type + "\"");
  return make_rule(type);
}

}  // namespace optfuse::optim

namespace optfuse {

void register_optimizer(const CustomOptimizer& def) {
  CustomOptimizer d = def;
  d.type = optim::lower(def.type);
  const std::string what = "register_optimizer " + optim::quoted(d.type) + ": ";
  for (const std::string& t : optim::rule_types())
    if (t == d.type) throw Error(what + "the name is taken (types: built-ins and registered)");
  if (d.type == "custom") throw Error(what + "the name is reserved");
  optim::make_custom_rule(d);  // checks the graph with the defaults
  std::lock_guard<std::mutex> lock(optim::registry_mutex());
  optim::registry()[d.type] = std::move(d);
}

CustomOptimizer custom_optimizer_from_json(const Options& def) {
  const std::string where = "custom optimizer";
  if (!def.is_object()) throw Error(where + ": the definition must be a JSON object");
  for (const auto& [key, value] : def.items())
    if (key != "name" && key != "defaults" && key != "graph")
      throw Error(where + ": unknown field '" + key + "' (expected name, defaults, graph)");
  if (!def.contains("name") || !def["name"].is_string())
    throw Error(where + ": needs \"name\" (a string)");
  if (!def.contains("graph")) throw Error(where + ": needs \"graph\"");
  CustomOptimizer c;
  c.type = def["name"].get<std::string>();
  check_name(c.type, where + " name");  // before messages show it
  c.defaults = def.value("defaults", Options::object());
  Graph g = graph_json::from_json(def["graph"], where + " '" + c.type + "'");
  c.graph = [g](const Options&) { return g; };
  return c;
}

}  // namespace optfuse
