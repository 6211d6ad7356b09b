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
// its mean over all dims but the first, after L2 weight decay (the GC paper's Adam_GC order):
// the graphs label that gradient (grad_centralization.h), group_plan.cpp's transform centralizes
// it. Structure (compiled in): AMSGrad or not; Adam vs AdamW is a different graph.
//
// Without master weights (16-bit params updated in their own dtype, precision.h) the graph is
// written in the op order of the vector loop of torch's fused CPU kernel
// (pytorch's aten/src/ATen/native/cpu/FusedAdamKernel.cpp, adam_math for Half / BFloat16:
// everything in f32, each stored value rounded once):
//   p = p * (1 - lr * weight_decay)           (AdamW; rounded before the step is added)
//   v = (1 - beta2) * g * g + v * beta2       (torch's binary contracts it as fma(c*g, g, v*beta2);
//                                              here an f64 multiply-add of the f32 products)
//   denom = sqrt(v) / sqrt(1 - beta2^t) + eps  (correctly rounded: a divide, or a multiply-add
//                                              where it is exact, src/optim/exact_division.h)
//   p = p + (-step_size * m) / denom
// so that the rounded params and moments are torch's bits (tests/python/test_master_weights.py).
#include <cmath>

#include "optim/adam_family.h"
#include "optim/exact_division.h"
#include "optim/grad_centralization.h"
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

  std::optional<std::vector<std::string>> graph_options() const override {
    return std::vector<std::string>{"amsgrad"};
  }

  Graph graph(const Options& h) const override {
    bool amsgrad = h.at("amsgrad").get<bool>();
    Graph gr(type_ + (amsgrad ? "_amsgrad" : ""));
    Moments mo = adam_moments(gr, decoupled_);
    Value v_used = mo.v;
    if (amsgrad) {
      v_used = max(gr.state("max_exp_avg_sq"), mo.v);
      gr.output("max_exp_avg_sq", v_used);
    }
    Value denom = sqrt(v_used) * gr.scalar("inv_bias_correction2_sqrt") + gr.scalar("eps");
    gr.output("param", mo.p - gr.scalar("step_size") * (mo.m / denom));
    return gr;
  }

  Graph unmastered_graph(const Options& h) const override {
    bool amsgrad = h.at("amsgrad").get<bool>();
    Graph gr(type_ + (amsgrad ? "_amsgrad" : "") + "_torch_order");
    Value p = gr.param("param"), m = gr.state("exp_avg"), v = gr.state("exp_avg_sq");
    Value g = gr.scalar("grad_sign") * gr.grad("grad");
    if (decoupled_) {
      p = strict(p * gr.scalar("decay"));  // torch rounds it before the step is added
    } else {
      g = g + p * gr.scalar("weight_decay");
    }
    g = effective_grad(g);  // (where gradient centralization applies)
    Value m_new = m + gr.scalar("one_minus_beta1") * (g - m);
    // torch's fma((1 - beta2) g, g, v beta2), the two inner products rounded in f32. In f32 LLVM
    // rewrites (c g) g as (g g) c (a reassociation rule that looks at the outer multiply only),
    // so the multiply-add is done in f64: the product of two f32 values is exact there, and the
    // sum is rounded to f64 then to f32, which differs from one rounding only where the f64
    // result is an f32 tie that the exact sum is not (about once in 2^28 values). On x86 with
    // FMA the lowering compiles this form as one f32 FMA, rounded once (src/lower/fma.h).
    Value cg = strict(gr.scalar("one_minus_beta2") * g), vb = strict(v * gr.scalar("beta2"));
    Value v_new =
        cast(cast(cg, DType::F64) * cast(g, DType::F64) + cast(vb, DType::F64), DType::F32);
    gr.output("exp_avg", m_new);
    gr.output("exp_avg_sq", v_new);
    Value v_used = v_new;
    if (amsgrad) {
      v_used = max(gr.state("max_exp_avg_sq"), v_new);
      gr.output("max_exp_avg_sq", v_used);
    }
    // sqrt(v) / bias_correction2_sqrt, correctly rounded, as one multiply-add where the host
    // proved that exact for this step's divisor (src/optim/exact_division.h), else divided. The
    // condition is a scalar: the lowering compiles each case as a loop of its own.
    Value root = sqrt(v_used);
    Value by_fma =
        cast(cast(root, DType::F64) * cast(gr.scalar("inv_bias_correction2_sqrt_hi"), DType::F64) +
                 cast(strict(root * gr.scalar("inv_bias_correction2_sqrt_lo")), DType::F64),
             DType::F32);
    Value scaled = select(gr.scalar("inv_bias_correction2_sqrt_exact", DType::Bool), by_fma,
                          root / gr.scalar("bias_correction2_sqrt"));
    // (strict: with the multiply-add, LLVM would make (fma(x, hi, x * lo) + eps) fma(x, hi,
    // fma(x, lo, eps)), another rounding)
    Value denom = strict(scaled + gr.scalar("eps"));
    gr.output("param", p + (gr.scalar("neg_step_size") * m_new) / denom);
    return gr;
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
    (*out)["bias_correction2_sqrt"] = std::sqrt(bias_correction2);  // (unmastered_graph's)
    const ScalarReciprocal r = split_reciprocal(static_cast<float>(std::sqrt(bias_correction2)));
    (*out)["inv_bias_correction2_sqrt_hi"] = r.hi;
    (*out)["inv_bias_correction2_sqrt_lo"] = r.lo;
    (*out)["inv_bias_correction2_sqrt_exact"] = r.exact ? 1.0 : 0.0;
    (*out)["neg_step_size"] = -(lr / bias_correction1);
  }

 private:
  bool decoupled_;
  std::string type_;
};

}  // namespace

std::unique_ptr<UpdateRule> make_adam(bool decoupled) { return std::make_unique<Adam>(decoupled); }

}  // namespace optfuse::optim
