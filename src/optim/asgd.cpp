// torch.optim.ASGD: https://pytorch.org/docs/stable/generated/torch.optim.ASGD.html
//   g = maximize ? -grad : grad;  g += weight_decay * p
//   p = p * (1 - lambd * eta) - eta * g
//   ax = (mu == 1) ? p : ax + (p - ax) * mu                    (ax, from zeros)
//   then, for the next step (t: this step's count, lr: this step's):
//   eta = lr / (1 + lambd * lr * t)^alpha;  mu = 1 / max(1, t - t0)
// eta and mu are torch's per-tensor state['eta'] / state['mu'] (float32 0-d tensors): host state
// here, kept in double, saved with the state file, and bound to torch's tensors by the Python
// package. eta starts at the group's lr at the tensor's first step, mu at 1. Whether mu is 1 is
// decided on the host in float32, as torch's mu.item() != 1 decides it, and passed as the scalar
// `ax_copy`: through step t0 + 2 (torch's default t0 = 1e6) ax is the param itself, exactly.
// One structure: every hyperparameter is a runtime scalar.
#include <algorithm>
#include <cmath>

#include "optfuse/error.h"
#include "optim/options.h"
#include "optim/rule.h"

namespace optfuse::optim {
namespace {

class Asgd final : public UpdateRule {
 public:
  const std::string& type() const override { return type_; }

  Options defaults() const override {
    return {{"lr", 1e-2}, {"lambd", 1e-4},       {"alpha", 0.75},
            {"t0", 1e6},  {"weight_decay", 0.0}, {"maximize", false}};
  }

  void validate(const Options& h, const std::string& where) const override {
    double lr = number(h, "lr", where), lambd = number(h, "lambd", where);
    double alpha = number(h, "alpha", where), wd = number(h, "weight_decay", where);
    number(h, "t0", where);
    flag(h, "maximize", where);
    if (lr < 0) throw Error(where + ": Invalid learning rate: " + pyfloat(lr));
    if (lambd < 0) throw Error(where + ": Invalid lambd value: " + pyfloat(lambd));
    if (alpha < 0) throw Error(where + ": Invalid alpha value: " + pyfloat(alpha));
    if (wd < 0) throw Error(where + ": Invalid weight_decay value: " + pyfloat(wd));
  }

  std::optional<std::vector<std::string>> graph_options() const override {
    return std::vector<std::string>{};  // scalars only
  }

  Graph graph(const Options&) const override {
    Graph gr("asgd");
    Value p = gr.param("param"), ax = gr.state("ax");
    Value g = gr.scalar("grad_sign") * gr.grad("grad") + gr.scalar("weight_decay") * p;
    Value p_new = p * gr.scalar("decay") - gr.scalar("eta") * g;
    Value averaged = ax + (p_new - ax) * gr.scalar("mu");
    gr.output("param", p_new);
    gr.output("ax", select(gr.scalar("ax_copy") > gr.constant(0.5), p_new, averaged));
    return gr;
  }

  HostState initial_host_state(const Options& h) const override {
    return {{"eta", h.at("lr").get<double>()}, {"mu", 1.0}};
  }

  void scalars(const Options& h, const TensorStep& t,
               std::map<std::string, double>* out) const override {
    if (!t.host || !t.host->count("eta") || !t.host->count("mu"))
      internal_error("asgd: no eta / mu host state");
    double lr = h.at("lr").get<double>(), lambd = h.at("lambd").get<double>();
    double& eta = t.host->at("eta");
    double& mu = t.host->at("mu");
    (*out)["grad_sign"] = h.at("maximize").get<bool>() ? -1.0 : 1.0;
    (*out)["weight_decay"] = h.at("weight_decay").get<double>();
    (*out)["decay"] = 1.0 - lambd * eta;
    (*out)["eta"] = eta;
    (*out)["mu"] = mu;
    (*out)["ax_copy"] = static_cast<float>(mu) == 1.0f ? 1.0 : 0.0;
    const double step = static_cast<double>(t.step);
    eta = lr / std::pow(1.0 + lambd * lr * step, h.at("alpha").get<double>());
    mu = 1.0 / std::max(1.0, step - h.at("t0").get<double>());
  }

 private:
  std::string type_ = "asgd";
};

}  // namespace

std::unique_ptr<UpdateRule> make_asgd() { return std::make_unique<Asgd>(); }

}  // namespace optfuse::optim
