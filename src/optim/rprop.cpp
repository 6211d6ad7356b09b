// torch.optim.Rprop: https://pytorch.org/docs/stable/generated/torch.optim.Rprop.html
//   g = maximize ? -grad : grad
//   s = sign(g * prev):  s > 0: etaplus,  s < 0: etaminus,  else 1         (factor)
//   step_size = clamp(step_size * factor, step_size_min, step_size_max)
//   g = 0 where factor == etaminus (the sign flipped; torch zeroes a clone of the grad)
//   p = p - sign(g) * step_size;  prev = g
// step_size starts at lr (torch's full_like(p, lr)), prev at 0: lr is read only then. torch's
// sign() is 0 for zeros and NaN (optfuse's sign keeps them), so the update's sign is spelled out:
// a NaN gradient leaves the param and step size as torch leaves them. The factor is compared with
// etaminus as torch compares it (in float32), not derived from the sign again.
// One structure: etas and step_sizes are runtime scalars.
#include "optfuse/error.h"
#include "optim/options.h"
#include "optim/rule.h"

namespace optfuse::optim {
namespace {

// torch.sign: 1, -1, or 0 (also for -0 and NaN).
Value torch_sign(Graph& gr, Value x) {
  Value zero = gr.constant(0.0);
  return select(x > zero, gr.constant(1.0), select(x < zero, gr.constant(-1.0), zero));
}

class Rprop final : public UpdateRule {
 public:
  const std::string& type() const override { return type_; }

  Options defaults() const override {
    return {{"lr", 1e-2}, {"etas", {0.5, 1.2}}, {"step_sizes", {1e-6, 50.0}}, {"maximize", false}};
  }

  void validate(const Options& h, const std::string& where) const override {
    double lr = number(h, "lr", where);
    auto [etaminus, etaplus] = pair(h, "etas", where);
    pair(h, "step_sizes", where);
    flag(h, "maximize", where);
    if (lr < 0) throw Error(where + ": Invalid learning rate: " + pyfloat(lr));
    if (!(0.0 < etaminus && etaminus < 1.0 && 1.0 < etaplus))
      throw Error(where + ": Invalid eta values: " + pyfloat(etaminus) + ", " + pyfloat(etaplus));
  }

  std::optional<std::vector<std::string>> graph_options() const override {
    return std::vector<std::string>{};  // scalars only
  }

  Graph graph(const Options&) const override {
    Graph gr("rprop");
    Value p = gr.param("param"), prev = gr.state("prev"), step_size = gr.state("step_size");
    Value grad = gr.grad("grad"), grad_sign = gr.scalar("grad_sign");
    Value g = grad * grad_sign;
    Value zero = gr.constant(0.0);
    // g * prev exactly (grad_sign is +-1), written in the idioms' normal form (uniform outermost).
    Value product = (grad * prev) * grad_sign;
    Value etaminus = gr.scalar("etaminus");
    Value factor = select(product > zero, gr.scalar("etaplus"),
                          select(product < zero, etaminus, gr.constant(1.0)));
    // torch's clamp. A NaN step size stays NaN: the comparisons are false for it, and the bounds
    // are finite (validated). (min / max would lower to NaN-propagating forms of several ops.)
    Value lo = gr.scalar("step_size_min"), hi = gr.scalar("step_size_max");
    Value scaled = step_size * factor;
    Value above_lo = select(lo > scaled, lo, scaled);
    Value s_new = select(hi < above_lo, hi, above_lo);
    Value g_kept = select(gr.make(Op::Eq, {factor, etaminus}), zero, g);
    gr.output("step_size", s_new);
    gr.output("prev", g_kept);
    gr.output("param", p - torch_sign(gr, g_kept) * s_new);
    return gr;
  }

  double initial_state_value(const Options& h, const std::string& name) const override {
    return name == "step_size" ? h.at("lr").get<double>() : 0.0;
  }

  void scalars(const Options& h, const TensorStep&,
               std::map<std::string, double>* out) const override {
    (*out)["grad_sign"] = h.at("maximize").get<bool>() ? -1.0 : 1.0;
    (*out)["etaminus"] = h.at("etas")[0].get<double>();
    (*out)["etaplus"] = h.at("etas")[1].get<double>();
    (*out)["step_size_min"] = h.at("step_sizes")[0].get<double>();
    (*out)["step_size_max"] = h.at("step_sizes")[1].get<double>();
  }

 private:
  std::string type_ = "rprop";
};

}  // namespace

std::unique_ptr<UpdateRule> make_rprop() { return std::make_unique<Rprop>(); }

}  // namespace optfuse::optim
