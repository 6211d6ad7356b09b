// torch.optim.NAdam: https://pytorch.org/docs/stable/generated/torch.optim.NAdam.html
//   g = maximize ? -grad : grad
//   weight_decay: decoupled ? p *= 1 - lr * weight_decay : g += weight_decay * p
//   mu_t = beta1 * (1 - 0.5 * 0.96^(t * momentum_decay)),  mu_{t+1} likewise   (host, double)
//   mu_product *= mu_t         (per tensor, across steps: torch's state['mu_product'], from 1)
//   m = lerp(m, g, 1 - beta1);  v = beta2 * v + (1 - beta2) * g * g
//   denom = sqrt(v / (1 - beta2^t)) + eps
//   p = p - lr (1 - mu_t) / (1 - mu_product) * (g / denom)
//         - lr mu_{t+1} / (1 - mu_product * mu_{t+1}) * (m / denom)
// mu_product is host state kept in double per tensor (TensorStep::host), advanced once per step
// and saved with the state file; torch keeps it as a float32 0-d tensor, whose rounding the tests
// account for. Structure (compiled in): decoupled_weight_decay.
#include <cmath>

#include "optfuse/error.h"
#include "optim/adam_family.h"
#include "optim/options.h"
#include "optim/rule.h"

namespace optfuse::optim {
namespace {

class Nadam final : public UpdateRule {
 public:
  const std::string& type() const override { return type_; }

  Options defaults() const override {
    return {{"lr", 2e-3},          {"betas", {0.9, 0.999}},  {"eps", 1e-8},
            {"weight_decay", 0.0}, {"momentum_decay", 4e-3}, {"decoupled_weight_decay", false},
            {"maximize", false}};
  }

  void validate(const Options& h, const std::string& where) const override {
    validate_adam_like(h, where);
    double md = number(h, "momentum_decay", where);
    if (md < 0) throw Error(where + ": Invalid momentum_decay value: " + pyfloat(md));
  }

  std::optional<std::vector<std::string>> graph_options() const override {
    return std::vector<std::string>{"decoupled_weight_decay"};
  }

  Graph graph(const Options& h) const override {
    bool dec = decoupled(h);
    Graph gr(std::string("nadam") + (dec ? "_decoupled" : ""));
    Moments mo = adam_moments(gr, dec);
    Value p = mo.p, g = mo.g, m_new = mo.m, v_new = mo.v;
    Value denom = sqrt(v_new) * gr.scalar("inv_bias_correction2_sqrt") + gr.scalar("eps");
    Value p_new =
        p - gr.scalar("grad_step") * (g / denom) - gr.scalar("exp_avg_step") * (m_new / denom);
    gr.output("param", p_new);
    return gr;
  }

  HostState initial_host_state(const Options&) const override { return {{"mu_product", 1.0}}; }

  void scalars(const Options& h, const TensorStep& t,
               std::map<std::string, double>* out) const override {
    if (!t.host || !t.host->count("mu_product")) internal_error("nadam: no mu_product host state");
    double lr = h.at("lr").get<double>();
    double b1 = h.at("betas")[0].get<double>(), b2 = h.at("betas")[1].get<double>();
    double md = h.at("momentum_decay").get<double>();
    double step = static_cast<double>(t.step);
    double mu = b1 * (1.0 - 0.5 * std::pow(0.96, step * md));
    double mu_next = b1 * (1.0 - 0.5 * std::pow(0.96, (step + 1.0) * md));
    double& mu_product = t.host->at("mu_product");
    mu_product *= mu;
    adam_moment_scalars(h, out);
    (*out)["inv_bias_correction2_sqrt"] = 1.0 / std::sqrt(1.0 - std::pow(b2, step));
    (*out)["grad_step"] = lr * (1.0 - mu) / (1.0 - mu_product);
    (*out)["exp_avg_step"] = lr * mu_next / (1.0 - mu_product * mu_next);
  }

 private:
  static bool decoupled(const Options& h) { return h.at("decoupled_weight_decay").get<bool>(); }
  std::string type_ = "nadam";
};

}  // namespace

std::unique_ptr<UpdateRule> make_nadam() { return std::make_unique<Nadam>(); }

}  // namespace optfuse::optim
