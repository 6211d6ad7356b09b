// torch.optim.Adadelta: https://pytorch.org/docs/stable/generated/torch.optim.Adadelta.html
//   g = maximize ? -grad : grad;  g += weight_decay * p
//   v = rho * v + (1 - rho) * g * g                           (square_avg)
//   delta = sqrt(u + eps) / sqrt(v + eps) * g                 (u: acc_delta, before this step)
//   u = rho * u + (1 - rho) * delta * delta
//   p = p - lr * delta
// One structure: every hyperparameter is a runtime scalar.
#include "optfuse/error.h"
#include "optim/options.h"
#include "optim/rule.h"

namespace optfuse::optim {
namespace {

class Adadelta final : public UpdateRule {
 public:
  const std::string& type() const override { return type_; }

  Options defaults() const override {
    return {{"lr", 1.0}, {"rho", 0.9}, {"eps", 1e-6}, {"weight_decay", 0.0}, {"maximize", false}};
  }

  void validate(const Options& h, const std::string& where) const override {
    double lr = number(h, "lr", where), rho = number(h, "rho", where);
    double eps = number(h, "eps", where), wd = number(h, "weight_decay", where);
    flag(h, "maximize", where);
    if (lr < 0) throw Error(where + ": Invalid learning rate: " + pyfloat(lr));
    if (rho < 0 || rho > 1) throw Error(where + ": Invalid rho value: " + pyfloat(rho));
    if (eps < 0) throw Error(where + ": Invalid epsilon value: " + pyfloat(eps));
    if (wd < 0) throw Error(where + ": Invalid weight_decay value: " + pyfloat(wd));
  }

  std::optional<std::vector<std::string>> graph_options() const override {
    return std::vector<std::string>{};  // scalars only
  }

  Graph graph(const Options&) const override {
    Graph gr("adadelta");
    Value p = gr.param("param"), v = gr.state("square_avg"), u = gr.state("acc_delta");
    Value g = gr.scalar("grad_sign") * gr.grad("grad") + gr.scalar("weight_decay") * p;
    Value rho = gr.scalar("rho"), one_minus_rho = gr.scalar("one_minus_rho");
    Value eps = gr.scalar("eps");
    // delta in torch's order (delta = sqrt(u + eps); delta /= std; delta *= g), strict: with
    // reassociation LLVM folds its two uses apart, (sqrt(u + eps) * g) / std for acc_delta and
    // (lr * g * sqrt(u + eps)) / std for the param, two divides. square_avg is strict too, so
    // that the value stored is the one delta was computed from.
    Value v_new = strict(rho * v + one_minus_rho * (g * g));
    Value delta = strict(sqrt(u + eps) / sqrt(v_new + eps) * g);
    gr.output("square_avg", v_new);
    gr.output("acc_delta", rho * u + one_minus_rho * (delta * delta));
    gr.output("param", p - gr.scalar("lr") * delta);
    return gr;
  }

  void scalars(const Options& h, const TensorStep&,
               std::map<std::string, double>* out) const override {
    double rho = h.at("rho").get<double>();
    (*out)["grad_sign"] = h.at("maximize").get<bool>() ? -1.0 : 1.0;
    (*out)["weight_decay"] = h.at("weight_decay").get<double>();
    (*out)["rho"] = rho;
    (*out)["one_minus_rho"] = 1.0 - rho;
    (*out)["eps"] = h.at("eps").get<double>();
    (*out)["lr"] = h.at("lr").get<double>();
  }

 private:
  std::string type_ = "adadelta";
};

}  // namespace

std::unique_ptr<UpdateRule> make_adadelta() { return std::make_unique<Adadelta>(); }

}  // namespace optfuse::optim
