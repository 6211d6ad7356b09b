// torch.optim.Adafactor: https://pytorch.org/docs/stable/generated/torch.optim.Adafactor.html
//   g = maximize ? -grad : grad;  t = step (after its increment)
//   w = t^beta2_decay;  rho = min(lr, 1 / sqrt(t));  alpha = max(eps2, RMS(p)) * rho
//   p = p * (1 - lr * weight_decay)
//   two or more dims, factored over the last two (the leading ones are batches of matrices):
//     row_var = lerp(row_var, mean over a row of g^2, w)            (one per row, [..., R, 1])
//     col_var = lerp(col_var, mean over a column of g^2, w)         (one per column, [..., 1, C])
//     v = row_var * col_var / max(mean of the matrix's row_var, eps1)
//   fewer dims:
//     variance = lerp(variance, g^2, w);  v = variance
//   u = g / sqrt(max(v, eps1^2));  p = p - alpha / max(1, RMS(u) / d) * u
// with RMS(x) = ||x|| / sqrt(numel) over the whole tensor and eps1 = eps[0], or the param dtype's
// machine epsilon when it is null, as torch's.
//
// Two kernels, chosen per tensor: the factored graph is staged (src/lower/staged.h), one pass
// for the row and column means of g^2, then RMS(u) (which needs every new column variance) and
// RMS(p), then the update: g read three times and p twice, 24 bytes per f32 element. The
// vector graph is one kernel with the two RMS as prologue stages. Torch's order of operations
// is kept where it is cheap: its lerp's two formulas (fma(w, end - start, start) for w < 0.5,
// else fma(w - 1, end - start, end)), the variance estimate's product before its divide, and
// 1 / sqrt (correctly rounded twice, as torch's rsqrt_ on the CPU) rather than rsqrt's estimate.
// alpha and the clipping denominator are computed in double from the reductions (accumulated in
// double) and rounded once to f32, as torch's Python floats are when the update is added.
#include <cmath>
#include <limits>

#include "optfuse/error.h"
#include "optim/options.h"
#include "optim/rule.h"

namespace optfuse::optim {
namespace {

class Adafactor final : public UpdateRule {
 public:
  const std::string& type() const override { return type_; }

  Options defaults() const override {
    return {{"lr", 1e-2}, {"beta2_decay", -0.8}, {"eps", {nullptr, 1e-3}},
            {"d", 1.0},   {"weight_decay", 0.0}, {"maximize", false}};
  }

  void validate(const Options& h, const std::string& where) const override {
    const double lr = number(h, "lr", where), decay = number(h, "beta2_decay", where);
    const double d = number(h, "d", where), wd = number(h, "weight_decay", where);
    flag(h, "maximize", where);
    const auto [eps1, eps2] = epsilons(h, where);
    if (lr < 0) throw Error(where + ": Learning rate should be >= 0 but is: " + pyfloat(lr));
    if (decay > 0) throw Error(where + ": beta2_decay should be <= 0 but is: " + pyfloat(decay));
    if (eps1 && *eps1 < 0)
      throw Error(where + ": epsilon1 should be >= 0 but is: " + pyfloat(*eps1));
    if (eps2 < 0) throw Error(where + ": epsilon2 should be >= 0 but is: " + pyfloat(eps2));
    if (d < 1) throw Error(where + ": Clipping threshold d should be >= 1 but is: " + pyfloat(d));
    if (wd < 0) throw Error(where + ": weight_decay should be >= 0 but is: " + pyfloat(wd));
  }

  std::optional<std::vector<std::string>> graph_options() const override {
    return std::vector<std::string>{};  // scalars only
  }

  Graph graph(const Options&) const override {
    Graph gr("adafactor");
    Value p = gr.param("param"), grad = gr.grad("grad"), variance = gr.state("variance");
    Value v = lerp(gr, variance, grad * grad);  // (-g)^2 is g^2: the sign comes later
    gr.output("variance", v);
    gr.output("param", update(gr, p, grad, v));
    return gr;
  }

  std::optional<Graph> factored_graph(const Options&) const override {
    Graph gr("adafactor_factored");
    Value p = gr.param("param"), grad = gr.grad("grad");
    Value row_var = gr.row_state("row_var"), col_var = gr.col_state("col_var");
    Value squared = grad * grad;
    Value rows = lerp(gr, row_var, row_mean(squared));
    Value cols = lerp(gr, col_var, col_mean(squared));
    gr.output("row_var", rows);
    gr.output("col_var", cols);
    // torch: (row_var @ col_var) / clamp(row_var.mean(dim=-2), min=eps1), per matrix.
    Value estimate = rows * cols / max(col_mean(rows), gr.scalar("eps1"));
    gr.output("param", update(gr, p, grad, estimate));
    return gr;
  }

  void scalars(const Options& h, const TensorStep& t,
               std::map<std::string, double>* out) const override {
    const double step = static_cast<double>(t.step);
    const double lr = h.at("lr").get<double>();
    const auto [eps1, eps2] = epsilons(h, "");
    const double e1 = eps1 ? *eps1 : machine_epsilon(t.param);
    // torch's lerp_ takes its weight as a float, and picks its formula by it.
    const auto w = static_cast<float>(std::pow(step, h.at("beta2_decay").get<double>()));
    (*out)["grad_sign"] = h.at("maximize").get<bool>() ? -1.0 : 1.0;
    (*out)["lerp_weight"] = w;
    (*out)["lerp_weight_minus_one"] = static_cast<double>(w) - 1.0;
    (*out)["lerp_small"] = std::fabs(w) < 0.5f ? 1.0 : 0.0;
    (*out)["eps1"] = e1;
    (*out)["eps1_squared"] = e1 * e1;
    (*out)["eps2"] = eps2;
    (*out)["d"] = h.at("d").get<double>();
    (*out)["rho_t"] = std::min(lr, 1.0 / std::sqrt(step));
    (*out)["decay"] = 1.0 - lr * h.at("weight_decay").get<double>();
  }

 private:
  // eps = (eps1 or null, eps2); Error unless a list of a number or null and a number.
  static std::pair<std::optional<double>, double> epsilons(const Options& h,
                                                           const std::string& where) {
    const Options& e = h.at("eps");
    const bool ok =
        e.is_array() && e.size() == 2 && (e[0].is_null() || e[0].is_number()) && e[1].is_number();
    if (!ok)
      throw Error(where + ": option 'eps' must be a list of two numbers (the first may be " +
                  "null), got " + message_text(e));
    std::optional<double> eps1;
    if (!e[0].is_null()) eps1 = e[0].get<double>();
    const double eps2 = e[1].get<double>();
    if ((eps1 && !std::isfinite(*eps1)) || !std::isfinite(eps2))
      throw Error(where + ": option 'eps' must be finite, got " + message_text(e));
    return {eps1, eps2};
  }

  // torch.finfo(dtype).eps: eps1's default.
  static double machine_epsilon(DType t) {
    switch (t) {
      case DType::F64:
        return std::numeric_limits<double>::epsilon();
      case DType::BF16:
        return 0.0078125;
      case DType::F16:
        return 0.0009765625;
      default:
        return std::numeric_limits<float>::epsilon();
    }
  }

  // Scalar `name`, declared at its first use.
  static Value scalar(Graph& gr, const std::string& name, DType t = DType::F32) {
    const NodeId id = gr.find_scalar(name);
    return id >= 0 ? gr.value(id) : gr.scalar(name, t);
  }

  // torch's lerp_(end, w) on the CPU: the formula its vector loop uses for the weight's size.
  static Value lerp(Graph& gr, Value start, Value end) {
    Value diff = end - start;
    return select(scalar(gr, "lerp_small", DType::Bool), start + scalar(gr, "lerp_weight") * diff,
                  end + scalar(gr, "lerp_weight_minus_one") * diff);
  }

  // p * (1 - lr * wd) - alpha / max(1, RMS(u) / d) * u, u = g / sqrt(max(v, eps1^2)); the
  // scalar factor in double from the two RMS, rounded once. The sign of g (maximize) joins that
  // factor (exact: it is +-1), the idiom normal form's gathering of uniform factors.
  static Value update(Graph& gr, Value p, Value grad, Value v) {
    Value u_abs = grad * (gr.constant(1.0) / sqrt(max(v, gr.scalar("eps1_squared"))));
    auto rms = [](Value x) {
      Value wide = cast(x, DType::F64);
      return sqrt(reduce_mean(wide * wide));
    };
    Value one = gr.constant(1.0, DType::F64);
    Value denom = max(one, rms(u_abs) / gr.scalar("d", DType::F64));
    Value alpha = max(gr.scalar("eps2", DType::F64), rms(p)) * gr.scalar("rho_t", DType::F64);
    Value factor = cast(-(alpha / denom), DType::F32) * gr.scalar("grad_sign");
    return p * gr.scalar("decay") + factor * u_abs;
  }

  std::string type_ = "adafactor";
};

}  // namespace

std::unique_ptr<UpdateRule> make_adafactor() { return std::make_unique<Adafactor>(); }

}  // namespace optfuse::optim
