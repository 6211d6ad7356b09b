// torch.optim.Adam and AdamW (single-tensor algorithm, as documented by torch):
//   g = maximize ? -grad : grad
//   Adam:  g += weight_decay * p            AdamW: p *= 1 - lr * weight_decay
//   m = lerp(m, g, 1 - beta1)               v = beta2 * v + (1 - beta2) * g * g
//   AMSGrad: v_max = max(v_max, v), and v_max replaces v below
//   denom = sqrt(v) / sqrt(1 - beta2^t) + eps
//   p -= lr / (1 - beta1^t) * (m / denom)
// Everything that depends only on hyperparameters and t (1 - beta, bias corrections, the AdamW
// decay factor) is computed here on the host in double and rounded once: computing 1 - beta2 in
// fp32 inside the kernel alone costs ~1e-5 relative error against torch (measured).
// grad_centralization (MindSpore's option; Yong et al. 2020): for tensors with >= 2 dims, g -=
// its mean over all dims but the first, after L2 weight decay (the GC paper's Adam_GC order).
// Structure (compiled in): AMSGrad or not, GC or not; Adam vs AdamW is a different graph.
#include <cmath>

#include "optim/adam_family.h"
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
            {"maximize", false},
            {"grad_centralization", false}};
  }

  void validate(const Options& h, const std::string& where) const override {
    validate_adam_like(h, where);
  }

  std::string structure(const Options& h) const override {
    return std::string("amsgrad=") + (h.at("amsgrad").get<bool>() ? "1" : "0") +
           (h.value("grad_centralization", false) ? ",gc=1" : "");
  }

  Graph graph(const Options& h) const override {
    bool amsgrad = h.at("amsgrad").get<bool>();
    bool gc = h.value("grad_centralization", false);
    Graph gr(type_ + (amsgrad ? "_amsgrad" : "") + (gc ? "_gc" : ""));
    Moments mo = adam_moments(gr, decoupled_, gc);
    Value v_used = mo.v;
    if (amsgrad) {
      v_used = max(gr.state("max_exp_avg_sq"), mo.v);
      gr.output("max_exp_avg_sq", v_used);
    }
    Value denom = sqrt(v_used) * gr.scalar("inv_bias_correction2_sqrt") + gr.scalar("eps");
    gr.output("param", mo.p - gr.scalar("step_size") * (mo.m / denom));
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
    adam_moment_scalars(h, out);
    double lr = h.at("lr").get<double>();
    double b1 = h.at("betas")[0].get<double>(), b2 = h.at("betas")[1].get<double>();
    double step = static_cast<double>(t.step);
    double bias_correction1 = 1.0 - std::pow(b1, step);
    double bias_correction2 = 1.0 - std::pow(b2, step);
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
