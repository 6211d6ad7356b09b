// LAMB (You et al. 2019, "Large Batch Optimization for Deep Learning"), per tensor, as NVIDIA
// apex's FusedLAMB computes it (adam_w_mode, without its global grad-norm clipping: clip
// separately):
//   m = beta1 m + (1 - beta1) g                 v = beta2 v + (1 - beta2) g^2
//   bias_correction: m_hat = m / (1 - beta1^t), v_hat = v / (1 - beta2^t); else m, v
//   u = m_hat / (sqrt(v_hat) + eps) + weight_decay * p
//   trust = ||p|| / ||u||, and 1 when either norm is 0 (apex, torch-optimizer); then
//   min(trust, max_trust_ratio) when max_trust_ratio > 0 (0: no clamp, apex's behaviour)
//   p = p - lr * trust * u
// ONE kernel: the two norms are reductions (prologue stages reading p, g, m, v; accumulated in
// double, rounded once to f32), the update an element-wise pass over the same tensors.
#include <cmath>
#include <limits>

#include "optfuse/error.h"
#include "optim/adam_family.h"
#include "optim/options.h"
#include "optim/rule.h"

namespace optfuse::optim {
namespace {

class Lamb final : public UpdateRule {
 public:
  const std::string& type() const override { return type_; }

  Options defaults() const override {
    return {{"lr", 1e-3},           {"betas", {0.9, 0.999}},   {"eps", 1e-6},
            {"weight_decay", 0.01}, {"bias_correction", true}, {"max_trust_ratio", 0.0}};
  }

  void validate(const Options& h, const std::string& where) const override {
    validate_adam_like(h, where);
    flag(h, "bias_correction", where);
    double clamp = number(h, "max_trust_ratio", where);
    if (clamp < 0)
      throw Error(where + ": Invalid max_trust_ratio value: " + pyfloat(clamp) +
                  " (0 disables the clamp)");
  }

  std::optional<std::vector<std::string>> graph_options() const override {
    return std::vector<std::string>{};  // scalars only
  }

  Graph graph(const Options&) const override {
    Graph gr("lamb");
    Value p = gr.param("param"), g = gr.grad("grad");
    Value m = gr.state("exp_avg"), v = gr.state("exp_avg_sq");
    Value m_new = m + gr.scalar("one_minus_beta1") * (g - m);
    Value v_new = gr.scalar("beta2") * v + gr.scalar("one_minus_beta2") * (g * g);
    gr.output("exp_avg", m_new);
    gr.output("exp_avg_sq", v_new);
    // Association as the idiom normal form (include/optfuse/idioms.h) has it, so that a LAMB
    // written op by op normalizes to this kernel: ibc1 * (m / denom), p - u * (trust * lr).
    Value u =
        gr.scalar("inv_bias_correction1") *
            (m_new / (sqrt(v_new) * gr.scalar("inv_bias_correction2_sqrt") + gr.scalar("eps"))) +
        gr.scalar("weight_decay") * p;
    Value p_sq = sum_squares(p), u_sq = sum_squares(u);
    Value one = gr.constant(1.0), zero = gr.constant(0.0);
    Value trust = select(p_sq > zero, select(u_sq > zero, sqrt(p_sq) / sqrt(u_sq), one), one);
    trust = min(trust, gr.scalar("max_trust_ratio"));
    gr.output("param", p - u * (trust * gr.scalar("lr")));
    return gr;
  }

  void scalars(const Options& h, const TensorStep& t,
               std::map<std::string, double>* out) const override {
    double b1 = h.at("betas")[0].get<double>(), b2 = h.at("betas")[1].get<double>();
    bool bc = h.at("bias_correction").get<bool>();
    double step = static_cast<double>(t.step);
    double clamp = h.at("max_trust_ratio").get<double>();
    (*out)["lr"] = h.at("lr").get<double>();
    (*out)["one_minus_beta1"] = 1.0 - b1;
    (*out)["beta2"] = b2;
    (*out)["one_minus_beta2"] = 1.0 - b2;
    (*out)["eps"] = h.at("eps").get<double>();
    (*out)["weight_decay"] = h.at("weight_decay").get<double>();
    (*out)["inv_bias_correction1"] = bc ? 1.0 / (1.0 - std::pow(b1, step)) : 1.0;
    (*out)["inv_bias_correction2_sqrt"] = bc ? 1.0 / std::sqrt(1.0 - std::pow(b2, step)) : 1.0;
    (*out)["max_trust_ratio"] = clamp > 0 ? clamp : std::numeric_limits<double>::infinity();
  }

 private:
  std::string type_ = "lamb";
};

}  // namespace

std::unique_ptr<UpdateRule> make_lamb() { return std::make_unique<Lamb>(); }

}  // namespace optfuse::optim
