// torch.optim.RAdam: https://pytorch.org/docs/stable/generated/torch.optim.RAdam.html
//   g = maximize ? -grad : grad
//   weight_decay: decoupled ? p *= 1 - lr * weight_decay : g += weight_decay * p
//   m = lerp(m, g, 1 - beta1);  v = beta2 * v + (1 - beta2) * g * g
//   rho_inf = 2 / (1 - beta2) - 1;  rho_t = rho_inf - 2 t beta2^t / (1 - beta2^t)      (host)
//   rho_t > 5: p = p - lr / (1 - beta1^t) * rect * sqrt(1 - beta2^t) * (m / (sqrt(v) + eps)),
//              rect = sqrt((rho_t - 4)(rho_t - 2) rho_inf / ((rho_inf - 4)(rho_inf - 2) rho_t))
//   else:      p = p - lr / (1 - beta1^t) * m
// The branch depends only on beta2 and t, so it is decided on the host each step and passed as
// the scalar `rectify` (1 or 0); the kernel selects m / (sqrt(v) + eps) or m with it. One
// compiled kernel thus serves both phases of training (no second kernel, no rebinding when a
// tensor crosses rho_t = 5, tensors of one group at different steps share it), and each branch is
// exactly torch's: the unrectified one never touches sqrt(v). Both sides are evaluated per
// element, which costs nothing measurable in a memory-bound kernel.
// Structure (compiled in): decoupled_weight_decay.
#include <cmath>

#include "optfuse/error.h"
#include "optim/adam_family.h"
#include "optim/options.h"
#include "optim/rule.h"

namespace optfuse::optim {
namespace {

class Radam final : public UpdateRule {
 public:
  const std::string& type() const override { return type_; }

  Options defaults() const override {
    return {{"lr", 1e-3},          {"betas", {0.9, 0.999}},           {"eps", 1e-8},
            {"weight_decay", 0.0}, {"decoupled_weight_decay", false}, {"maximize", false}};
  }

  void validate(const Options& h, const std::string& where) const override {
    validate_adam_like(h, where);
  }

  std::optional<std::vector<std::string>> graph_options() const override {
    return std::vector<std::string>{"decoupled_weight_decay"};
  }

  Graph graph(const Options& h) const override {
    bool dec = decoupled(h);
    Graph gr(std::string("radam") + (dec ? "_decoupled" : ""));
    Moments mo = adam_moments(gr, dec);
    Value p = mo.p, m_new = mo.m, v_new = mo.v;
    Value rectified = m_new / (sqrt(v_new) + gr.scalar("eps"));
    Value d = select(gr.scalar("rectify") > gr.constant(0.5), rectified, m_new);
    gr.output("param", p - gr.scalar("step_size") * d);
    return gr;
  }

  void scalars(const Options& h, const TensorStep& t,
               std::map<std::string, double>* out) const override {
    double lr = h.at("lr").get<double>();
    double b1 = h.at("betas")[0].get<double>(), b2 = h.at("betas")[1].get<double>();
    double step = static_cast<double>(t.step);
    double bias_correction1 = 1.0 - std::pow(b1, step);
    double bias_correction2 = 1.0 - std::pow(b2, step);
    double rho_inf = 2.0 / (1.0 - b2) - 1.0;
    double rho_t = rho_inf - 2.0 * step * std::pow(b2, step) / bias_correction2;
    bool rectify = rho_t > 5.0;
    double step_size = lr / bias_correction1;
    if (rectify) {
      double rect = std::sqrt((rho_t - 4.0) * (rho_t - 2.0) * rho_inf /
                              ((rho_inf - 4.0) * (rho_inf - 2.0) * rho_t));
      step_size *= rect * std::sqrt(bias_correction2);
    }
    adam_moment_scalars(h, out);
    (*out)["rectify"] = rectify ? 1.0 : 0.0;
    (*out)["step_size"] = step_size;
  }

 private:
  static bool decoupled(const Options& h) { return h.at("decoupled_weight_decay").get<bool>(); }
  std::string type_ = "radam";
};

}  // namespace

std::unique_ptr<UpdateRule> make_radam() { return std::make_unique<Radam>(); }

}  // namespace optfuse::optim
