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
#include "optim/options.h"
#include "optim/rule.h"

namespace optfuse::optim {
namespace {

class Nadam final : public UpdateRule {
 public:
  const std::string& type() const override { return type_; }

  Options defaults() const override {
    return {{"lr", 2e-3},
            {"betas", {0.9, 0.999}},
            {"eps", 1e-8},
            {"weight_decay", 0.0},
            {"momentum_decay", 4e-3},
            {"decoupled_weight_decay", false},
            {"maximize", false}};
  }

  void validate(const Options& h, const std::string& where) const override {
    double lr = number(h, "lr", where), eps = number(h, "eps", where);
    double wd = number(h, "weight_decay", where), md = number(h, "momentum_decay", where);
    auto [b1, b2] = pair(h, "betas", where);
    flag(h, "decoupled_weight_decay", where);
    flag(h, "maximize", where);
    if (lr < 0) throw Error(where + ": Invalid learning rate: " + pyfloat(lr));
    if (eps < 0) throw Error(where + ": Invalid epsilon value: " + pyfloat(eps));
    if (b1 < 0 || b1 >= 1) throw Error(where + ": Invalid beta parameter at index 0: " + pyfloat(b1));
    if (b2 < 0 || b2 >= 1) throw Error(where + ": Invalid beta parameter at index 1: " + pyfloat(b2));
    if (wd < 0) throw Error(where + ": Invalid weight_decay value: " + pyfloat(wd));
    if (md < 0) throw Error(where + ": Invalid momentum_decay value: " + pyfloat(md));
  }

  std::string structure(const Options& h) const override {
    return std::string("decoupled_weight_decay=") + (decoupled(h) ? "1" : "0");
  }

  Graph graph(const Options& h) const override {
    bool dec = decoupled(h);
    Graph gr(std::string("nadam") + (dec ? "_decoupled" : ""));
    Value p = gr.param("param"), m = gr.state("exp_avg"), v = gr.state("exp_avg_sq");
    Value g = gr.scalar("grad_sign") * gr.grad("grad");
    if (dec)
      p = p * gr.scalar("decay");
    else
      g = g + gr.scalar("weight_decay") * p;
    Value m_new = m + gr.scalar("one_minus_beta1") * (g - m);
    Value v_new = gr.scalar("beta2") * v + gr.scalar("one_minus_beta2") * (g * g);
    gr.output("exp_avg", m_new);
    gr.output("exp_avg_sq", v_new);
    Value denom = sqrt(v_new) * gr.scalar("inv_bias_correction2_sqrt") + gr.scalar("eps");
    Value p_new = p - gr.scalar("grad_step") * (g / denom) - gr.scalar("exp_avg_step") * (m_new / denom);
    gr.output("param", p_new);
    return gr;
  }

  std::vector<std::string> state_names(const Options&) const override {
    return {"exp_avg", "exp_avg_sq"};
  }
  std::vector<std::string> all_state_names() const override { return {"exp_avg", "exp_avg_sq"}; }
  HostState initial_host_state() const override { return {{"mu_product", 1.0}}; }

  void scalars(const Options& h, const TensorStep& t,
               std::map<std::string, double>* out) const override {
    if (!t.host || !t.host->count("mu_product")) internal_error("nadam: no mu_product host state");
    double lr = h.at("lr").get<double>(), wd = h.at("weight_decay").get<double>();
    double b1 = h.at("betas")[0].get<double>(), b2 = h.at("betas")[1].get<double>();
    double md = h.at("momentum_decay").get<double>();
    double step = static_cast<double>(t.step);
    double mu = b1 * (1.0 - 0.5 * std::pow(0.96, step * md));
    double mu_next = b1 * (1.0 - 0.5 * std::pow(0.96, (step + 1.0) * md));
    double& mu_product = t.host->at("mu_product");
    mu_product *= mu;
    (*out)["grad_sign"] = h.at("maximize").get<bool>() ? -1.0 : 1.0;
    (*out)["weight_decay"] = wd;
    (*out)["decay"] = 1.0 - lr * wd;
    (*out)["one_minus_beta1"] = 1.0 - b1;
    (*out)["beta2"] = b2;
    (*out)["one_minus_beta2"] = 1.0 - b2;
    (*out)["eps"] = h.at("eps").get<double>();
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
