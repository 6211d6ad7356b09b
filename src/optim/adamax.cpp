// torch.optim.Adamax: https://pytorch.org/docs/stable/generated/torch.optim.Adamax.html
//   g = maximize ? -grad : grad;  g += weight_decay * p
//   m = lerp(m, g, 1 - beta1)                               (exp_avg)
//   u = max(beta2 * u, |g| + eps)                           (exp_inf, NaN-propagating like torch)
//   p = p - (lr / (1 - beta1^t)) * (m / u)                  (lr / bias correction: host, double)
// One structure: every hyperparameter is a runtime scalar.
#include <cmath>

#include "optfuse/error.h"
#include "optim/adam_family.h"
#include "optim/rule.h"

namespace optfuse::optim {
namespace {

class Adamax final : public UpdateRule {
 public:
  const std::string& type() const override { return type_; }

  Options defaults() const override {
    return {{"lr", 2e-3},
            {"betas", {0.9, 0.999}},
            {"eps", 1e-8},
            {"weight_decay", 0.0},
            {"maximize", false}};
  }

  void validate(const Options& h, const std::string& where) const override {
    validate_adam_like(h, where);
  }

  std::optional<std::vector<std::string>> graph_options() const override {
    return std::vector<std::string>{};  // scalars only
  }

  Graph graph(const Options&) const override {
    Graph gr("adamax");
    Value p = gr.param("param"), m = gr.state("exp_avg"), u = gr.state("exp_inf");
    Value g = gr.scalar("grad_sign") * gr.grad("grad") + gr.scalar("weight_decay") * p;
    Value m_new = m + gr.scalar("one_minus_beta1") * (g - m);
    Value u_new = max(gr.scalar("beta2") * u, abs(g) + gr.scalar("eps"));
    gr.output("exp_avg", m_new);
    gr.output("exp_inf", u_new);
    gr.output("param", p - gr.scalar("clr") * (m_new / u_new));
    return gr;
  }

  void scalars(const Options& h, const TensorStep& t,
               std::map<std::string, double>* out) const override {
    adam_moment_scalars(h, out);
    double b1 = h.at("betas")[0].get<double>();
    (*out)["clr"] = h.at("lr").get<double>() / (1.0 - std::pow(b1, static_cast<double>(t.step)));
  }

 private:
  std::string type_ = "adamax";
};

}  // namespace

std::unique_ptr<UpdateRule> make_adamax() { return std::make_unique<Adamax>(); }

}  // namespace optfuse::optim
