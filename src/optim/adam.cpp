// torch.optim.Adam and AdamW (single-tensor algorithm, as documented by torch):
//   g = maximize ? -grad : grad
//   Adam:  g += weight_decay * p            AdamW: p *= 1 - lr * weight_decay
//   m = lerp(m, g, 1 - beta1)               v = beta2 * v + (1 - beta2) * g * g
//   AMSGrad: v_max = max(v_max, v), and v_max replaces v below
//   denom = sqrt(v) / sqrt(1 - beta2^t) + eps
//   p -= lr / (1 - beta1^t) * (m / denom)
// Everything that depends only on hyperparameters and t (1 - beta, bias corrections, the AdamW
// decay factor) is computed here on the host in double and rounded once: computing 1 - beta2 in
// fp32 inside the kernel alone costs ~1e-5 relative error against torch (DESIGN.md).
// Structure (compiled in): AMSGrad or not; Adam vs AdamW is a different graph.
#include <cmath>

#include "optfuse/error.h"
#include "optim/options.h"
#include "optim/rule.h"

namespace optfuse::optim {
namespace {

class Adam final : public UpdateRule {
 public:
  explicit Adam(bool decoupled) : decoupled_(decoupled), type_(decoupled ? "adamw" : "adam") {}

  const std::string& type() const override { return type_; }

  Options defaults() const override {
    return {{"lr", 1e-3},
            {"betas", {0.9, 0.999}},
            {"eps", 1e-8},
            {"weight_decay", decoupled_ ? 1e-2 : 0.0},
            {"amsgrad", false},
            {"maximize", false}};
  }

  void validate(const Options& h, const std::string& where) const override {
    double lr = number(h, "lr", where), eps = number(h, "eps", where);
    double wd = number(h, "weight_decay", where);
    auto [b1, b2] = pair(h, "betas", where);
    flag(h, "amsgrad", where);
    flag(h, "maximize", where);
    if (lr < 0) throw Error(where + ": Invalid learning rate: " + pyfloat(lr));
    if (eps < 0) throw Error(where + ": Invalid epsilon value: " + pyfloat(eps));
    if (b1 < 0 || b1 >= 1) throw Error(where + ": Invalid beta parameter at index 0: " + pyfloat(b1));
    if (b2 < 0 || b2 >= 1) throw Error(where + ": Invalid beta parameter at index 1: " + pyfloat(b2));
    if (wd < 0) throw Error(where + ": Invalid weight_decay value: " + pyfloat(wd));
  }

  std::string structure(const Options& h) const override {
    return std::string("amsgrad=") + (h.at("amsgrad").get<bool>() ? "1" : "0");
  }

  Graph graph(const Options& h) const override {
    bool amsgrad = h.at("amsgrad").get<bool>();
    Graph gr(type_ + (amsgrad ? "_amsgrad" : ""));
    Value p = gr.param("param"), m = gr.state("exp_avg"), v = gr.state("exp_avg_sq");
    Value g = gr.scalar("grad_sign") * gr.grad("grad");
    if (decoupled_)
      p = p * gr.scalar("decay");
    else
      g = g + gr.scalar("weight_decay") * p;
    Value m_new = m + gr.scalar("one_minus_beta1") * (g - m);
    Value v_new = gr.scalar("beta2") * v + gr.scalar("one_minus_beta2") * (g * g);
    gr.output("exp_avg", m_new);
    gr.output("exp_avg_sq", v_new);
    Value v_used = v_new;
    if (amsgrad) {
      v_used = max(gr.state("max_exp_avg_sq"), v_new);
      gr.output("max_exp_avg_sq", v_used);
    }
    Value denom = sqrt(v_used) * gr.scalar("inv_bias_correction2_sqrt") + gr.scalar("eps");
    gr.output("param", p - gr.scalar("step_size") * (m_new / denom));
    return gr;
  }

  std::vector<std::string> state_names(const Options& h) const override {
    if (h.at("amsgrad").get<bool>()) return {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
    return {"exp_avg", "exp_avg_sq"};
  }

  std::vector<std::string> all_state_names() const override {
    return {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
  }

  void scalars(const Options& h, const TensorStep& t,
               std::map<std::string, double>* out) const override {
    double lr = h.at("lr").get<double>(), wd = h.at("weight_decay").get<double>();
    double b1 = h.at("betas")[0].get<double>(), b2 = h.at("betas")[1].get<double>();
    double step = static_cast<double>(t.step);
    double bias_correction1 = 1.0 - std::pow(b1, step);
    double bias_correction2 = 1.0 - std::pow(b2, step);
    (*out)["grad_sign"] = h.at("maximize").get<bool>() ? -1.0 : 1.0;
    (*out)["weight_decay"] = wd;
    (*out)["decay"] = 1.0 - lr * wd;
    (*out)["one_minus_beta1"] = 1.0 - b1;
    (*out)["beta2"] = b2;
    (*out)["one_minus_beta2"] = 1.0 - b2;
    (*out)["eps"] = h.at("eps").get<double>();
    (*out)["step_size"] = lr / bias_correction1;
    (*out)["inv_bias_correction2_sqrt"] = 1.0 / std::sqrt(bias_correction2);
  }

 private:
  bool decoupled_;
  std::string type_;
};

}  // namespace

std::unique_ptr<UpdateRule> make_adam(bool decoupled) { return std::make_unique<Adam>(decoupled); }

}  // namespace optfuse::optim
