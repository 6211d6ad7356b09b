// torch.optim.Muon: https://pytorch.org/docs/stable/generated/torch.optim.Muon.html
//   b = lerp(b, g, 1 - momentum)                            (momentum_buffer, from zeros)
//   u = nesterov ? lerp(g, b, momentum) : b
//   O = NS(u)         Newton-Schulz orthogonalization of u as a [shape[0], numel / shape[0]]
//                     matrix in bf16 (newton_schulz.h), the opaque op between two kernels
//   p = p * (1 - lr * weight_decay) - adjusted_lr * O
// adjusted_lr = lr * ratio(A, B) for A x B = the matrix: "original" (torch's None) sqrt(max(1,
// A / B)), "match_rms_adamw" 0.2 sqrt(max(A, B)), "spectral_unclamped" sqrt(A / B). optfuse's
// option "ns_products" ("bf16", default, or "f32") is NewtonSchulz::f32_products. Each lerp is
// torch's: w < 0.5 ? start + w (end - start) : end + (w - 1) (end - start), with w rounded to
// float32 first; which form is structure (a momentum across 0.5 recompiles).
#include <algorithm>
#include <cmath>

#include "optfuse/error.h"
#include "optim/options.h"
#include "optim/rule.h"

namespace optfuse::optim {
namespace {

const char* const kAdjustments[] = {"original", "match_rms_adamw", "spectral_unclamped"};

// torch's lerp(start, end, w) with w = f32(weight): the scalar (w or w - 1) is a host scalar.
Value lerp(Graph& gr, Value start, Value end, double weight, const std::string& scalar) {
  const bool low = std::abs(static_cast<float>(weight)) < 0.5f;
  return (low ? start : end) + gr.scalar(scalar) * (end - start);
}
double lerp_scalar(double weight) {
  const float w = static_cast<float>(weight);
  return std::abs(w) < 0.5f ? w : double(w) - 1.0;  // (exact in float: Sterbenz)
}

class Muon final : public UpdateRule {
 public:
  const std::string& type() const override { return type_; }

  Options defaults() const override {
    NewtonSchulz ns;
    return {{"lr", 1e-3},
            {"weight_decay", 0.1},
            {"momentum", 0.95},
            {"nesterov", true},
            {"ns_coefficients", {ns.a, ns.b, ns.c}},
            {"eps", ns.eps},
            {"ns_steps", ns.steps},
            {"adjust_lr_fn", nullptr},
            {"ns_products", "bf16"}};  // optfuse's: NewtonSchulz::f32_products
  }

  void validate(const Options& h, const std::string& where) const override {
    const double lr = number(h, "lr", where), momentum = number(h, "momentum", where);
    const double wd = number(h, "weight_decay", where);
    number(h, "eps", where);
    flag(h, "nesterov", where);
    if (lr < 0) throw Error(where + ": Learning rate should be >= 0 but is: " + pyfloat(lr));
    if (momentum < 0) throw Error(where + ": momentum should be >= 0 but is: " + pyfloat(momentum));
    if (wd < 0) throw Error(where + ": weight decay should be >= 0 but is: " + pyfloat(wd));
    const Options& adjust = h.at("adjust_lr_fn");
    if (!adjust.is_null() &&
        (!adjust.is_string() || std::find(std::begin(kAdjustments), std::end(kAdjustments),
                                          adjust.get<std::string>()) == std::end(kAdjustments)))
      throw Error(where + ": Adjust learning rate function " + message_text(adjust) +
                  " is not supported");
    const Options& c = h.at("ns_coefficients");
    if (!c.is_array() || c.size() != 3 || !c[0].is_number() || !c[1].is_number() ||
        !c[2].is_number())
      throw Error(where + ": Coefficients must be a tuple of exactly 3 values");
    const Options& products = h.at("ns_products");
    if (products != "bf16" && products != "f32")
      throw Error(where + ": ns_products must be \"bf16\" or \"f32\", got " +
                  message_text(products));
    const double steps = number(h, "ns_steps", where);
    if (steps >= 100)
      throw Error(where + ": Number of steps must be less than 100 for computational efficiency");
    if (steps < 0 || steps != std::floor(steps))
      throw Error(where + ": ns_steps must be a whole number >= 0, got " + pyfloat(steps));
  }

  std::optional<std::vector<std::string>> graph_options() const override {
    return std::vector<std::string>{"momentum", "nesterov", "ns_coefficients",
                                    "ns_steps", "eps",      "ns_products"};
  }

  Graph graph(const Options& h) const override {
    const double momentum = h.at("momentum").get<double>();
    const bool nesterov = h.at("nesterov").get<bool>();
    Graph gr("muon");
    Value p = gr.param("param"), g = gr.grad("grad"), b = gr.state("momentum_buffer");
    Value b_new = lerp(gr, b, g, 1.0 - momentum, "buffer_weight");
    gr.output("momentum_buffer", b_new);
    Value u = nesterov ? lerp(gr, g, b_new, momentum, "nesterov_weight") : b_new;
    Value o = opaque(newton_schulz_callee(newton_schulz(h)), u);
    // The decay rounded apart, as torch's param.mul_() before its param.add_().
    gr.output("param", strict(p * gr.scalar("decay")) + gr.scalar("neg_adjusted_lr") * o);
    return gr;
  }

  std::vector<DefaultOpaque> default_opaques() const override {
    return {{"newton_schulz", newton_schulz_cblas(), OpaqueScope::Matrix}};
  }

  bool scalars_read_shape() const override { return true; }

  void scalars(const Options& h, const TensorStep& t,
               std::map<std::string, double>* out) const override {
    const double lr = h.at("lr").get<double>(), momentum = h.at("momentum").get<double>();
    (*out)["buffer_weight"] = lerp_scalar(1.0 - momentum);
    (*out)["nesterov_weight"] = lerp_scalar(momentum);
    (*out)["decay"] = 1.0 - lr * h.at("weight_decay").get<double>();
    // (Callers outside a step give no matrix: a 1 x 1 one.)
    const double rows = t.rows > 0 ? double(t.rows) : 1.0, cols = t.cols > 0 ? double(t.cols) : 1.0;
    (*out)["neg_adjusted_lr"] = -lr * ratio(h, rows, cols);
  }

 private:
  static NewtonSchulz newton_schulz(const Options& h) {
    NewtonSchulz ns;
    const Options& c = h.at("ns_coefficients");
    ns.a = c[0].get<double>();
    ns.b = c[1].get<double>();
    ns.c = c[2].get<double>();
    ns.steps = static_cast<int>(h.at("ns_steps").get<double>());
    ns.eps = h.at("eps").get<double>();
    ns.f32_products = h.at("ns_products") == "f32";
    return ns;
  }

  // torch's _adjust_lr ratio for an A x B matrix.
  static double ratio(const Options& h, double a, double b) {
    const Options& fn = h.at("adjust_lr_fn");
    const std::string name = fn.is_string() ? fn.get<std::string>() : "original";
    if (name == "match_rms_adamw") return 0.2 * std::sqrt(std::max(a, b));
    if (name == "spectral_unclamped") return std::sqrt(a / b);
    return std::sqrt(std::max(1.0, a / b));
  }

  std::string type_ = "muon";
};

}  // namespace

std::unique_ptr<UpdateRule> make_muon() { return std::make_unique<Muon>(); }

}  // namespace optfuse::optim
