#pragma once
// An UpdateRule is what only one optimizer knows: torch's defaults and validation, its update
// graph for given options, and the per-step host scalars (computed in double, rounded once to the
// kernel's dtype when the kernel is called). Everything else (which state buffers exist, their
// dtypes, when to recompile) is derived from the graph (group_plan.h). Adding an optimizer is
// one file with a make_* function, plus its line in the table of registry.cpp.
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "optfuse/graph.h"
#include "optfuse/optim.h"

namespace optfuse::optim {

// Per-tensor state a rule keeps on the host in double, by name (e.g. NAdam's running
// "mu_product", torch's state['mu_product']). Owned by the optimizer, saved with the state file.
using HostState = std::map<std::string, double>;

// What a rule may know about one tensor when computing its scalars.
struct TensorStep {
  int64_t step = 0;                // torch's state['step'] after this step's increment (1-based)
  bool state_created_now = false;  // its state buffers were created for this step
  HostState* host = nullptr;       // this tensor's host state; scalars() advances it by one step
  // The param as the matrix of the per-row view: rows = shape[0], cols = numel / rows (one row
  // when the caller gave no shape). Read only by rules whose scalars_read_shape() says so
  // (Muon's lr adjustment); 0 elsewhere.
  int64_t rows = 0, cols = 0;
  DType param = DType::F32;  // the param's dtype (Adafactor's eps1 default: its epsilon)
};

class UpdateRule {
 public:
  virtual ~UpdateRule() = default;
  virtual const std::string& type() const = 0;  // torch's name, lowercase: "adamw"
  // Whether the rule takes row-sparse gradients (Optimizer::set_sparse_grad) instead of dense
  // ones (torch: SparseAdam only).
  virtual bool sparse_grads() const { return false; }
  virtual Options defaults() const = 0;
  // Throws Error("<where>: Invalid ...") if `h` is not acceptable; `where` names the group.
  virtual void validate(const Options& h, const std::string& where) const = 0;
  // The update for options `h`: its state inputs are the tensor's state buffers (torch's names),
  // and options it reads only through scalars() may change at any step without recompiling.
  virtual Graph graph(const Options& h) const = 0;
  // The options graph(), unmastered_graph() and factored_graph() read. They are given these
  // alone (group_plan.h's graph_view), so reading another finds it missing at the first graph
  // built. nullopt (the default): every option.
  virtual std::optional<std::vector<std::string>> graph_options() const { return std::nullopt; }
  // Text equal for two option sets whose graphs are equal: while it stays the same, a group whose
  // options change (a scheduler's lr, which only scalars() reads) builds no graph and compiles
  // nothing. Default: the values of graph_options(), or of every option without them.
  virtual std::string structure(const Options& h) const;
  // The update of tensors of two or more dims, where it differs from graph()'s (torch's
  // Adafactor factors their second moment over the last two dims: a graph with row and column
  // state and reductions, src/lower/staged.h); none by default. Its tensors are viewed as
  // batches (their leading dims) of [rows, cols] matrices (their last two dims). It takes the
  // scalars graph() takes, or a subset.
  virtual std::optional<Graph> factored_graph(const Options& h) const {
    (void)h;
    return std::nullopt;
  }
  // The graph for 16-bit params without master weights ("master_weights": false, precision.h):
  // the same update as graph() in real arithmetic, with its f32 ops in the order of the rule's
  // torch fused twin where it has one, so that the values rounded once to the param's dtype are
  // torch's. Same inputs, outputs and scalars as graph(). Default: graph(h).
  virtual Graph unmastered_graph(const Options& h) const { return graph(h); }
  // The value a new state buffer is filled with (torch: zeros_like, except e.g. Adagrad's
  // full_like(p, initial_accumulator_value)); rounded to float32 once.
  virtual double initial_state_value(const Options& h, const std::string& name) const {
    (void)h;
    (void)name;
    return 0.0;
  }
  // The host state a tensor starts with (created with its state buffers, at its first step),
  // for its group's options then (e.g. ASGD's eta starts at lr). Its names are all the host
  // state the rule keeps, whatever the options.
  virtual HostState initial_host_state(const Options& h) const {
    (void)h;
    return {};
  }
  // The opaque ops the rule's graphs call and the implementation each gets where the engine has
  // none registered (Muon: its orthogonalization); registered when an optimizer is created.
  // Data, not a call on the engine, so that the rules link without it (tests/fuzz).
  struct DefaultOpaque {
    std::string callee;
    OpaqueFn fn;
    OpaqueScope scope;
  };
  virtual std::vector<DefaultOpaque> default_opaques() const { return {}; }
  // Whether scalars() reads TensorStep::rows and ::cols: tensors of a group then share their
  // scalars only when those are equal too.
  virtual bool scalars_read_shape() const { return false; }
  // Writes this step's scalars; may advance *t.host (called exactly once per tensor and step).
  virtual void scalars(const Options& h, const TensorStep& t,
                       std::map<std::string, double>* out) const = 0;
};

// The rule for a torch.optim type name (case-insensitive); Error listing the known ones if none.
std::unique_ptr<UpdateRule> make_rule(const std::string& type);
std::vector<std::string> rule_types();  // built-ins, then registered custom types

// Custom optimizers (custom.cpp): a config's rule ({"type": "custom", "rule": {...}} or any
// type, built-in or registered); a registered type's rule or null; the registered names.
std::unique_ptr<UpdateRule> make_rule_for_config(const Options& config);
std::unique_ptr<UpdateRule> make_custom_rule(const CustomOptimizer& def);
std::unique_ptr<UpdateRule> make_registered_rule(const std::string& type);
std::vector<std::string> registered_types();

}  // namespace optfuse::optim
