// torch.optim.Adagrad: https://pytorch.org/docs/stable/generated/torch.optim.Adagrad.html
//   g = maximize ? -grad : grad;  g += weight_decay * p
//   clr = lr / (1 + (t - 1) * lr_decay)                     (host, double)
//   sum = sum + g * g                                       (sum starts at
//   initial_accumulator_value) p = p - clr * (g / (sqrt(sum) + eps))
// One structure: every hyperparameter is a runtime scalar. torch fills `sum` when the param is
// added to the optimizer; optfuse creates it at the tensor's first step with the group's value
// then (the same unless initial_accumulator_value is changed in between).
#include "optfuse/error.h"
#include "optim/options.h"
#include "optim/rule.h"

namespace optfuse::optim {
namespace {

class Adagrad final : public UpdateRule {
 public:
  const std::string& type() const override { return type_; }

  Options defaults() const override {
    return {{"lr", 1e-2},          {"lr_decay", 0.0},
            {"weight_decay", 0.0}, {"initial_accumulator_value", 0.0},
            {"eps", 1e-10},        {"maximize", false}};
  }

  void validate(const Options& h, const std::string& where) const override {
    double lr = number(h, "lr", where), lr_decay = number(h, "lr_decay", where);
    double wd = number(h, "weight_decay", where);
    double init = number(h, "initial_accumulator_value", where), eps = number(h, "eps", where);
    flag(h, "maximize", where);
    if (lr < 0) throw Error(where + ": Invalid learning rate: " + pyfloat(lr));
    if (lr_decay < 0) throw Error(where + ": Invalid lr_decay value: " + pyfloat(lr_decay));
    if (wd < 0) throw Error(where + ": Invalid weight_decay value: " + pyfloat(wd));
    if (init < 0)
      throw Error(where + ": Invalid initial_accumulator_value value: " + pyfloat(init));
    if (eps < 0) throw Error(where + ": Invalid epsilon value: " + pyfloat(eps));
  }

  std::optional<std::vector<std::string>> graph_options() const override {
    return std::vector<std::string>{};  // scalars only
  }

  Graph graph(const Options&) const override {
    Graph gr("adagrad");
    Value p = gr.param("param"), sum = gr.state("sum");
    Value g = gr.scalar("grad_sign") * gr.grad("grad") + gr.scalar("weight_decay") * p;
    Value sum_new = sum + g * g;
    gr.output("sum", sum_new);
    gr.output("param", p - gr.scalar("clr") * (g / (sqrt(sum_new) + gr.scalar("eps"))));
    return gr;
  }

  double initial_state_value(const Options& h, const std::string& name) const override {
    return name == "sum" ? h.at("initial_accumulator_value").get<double>() : 0.0;
  }

  void scalars(const Options& h, const TensorStep& t,
               std::map<std::string, double>* out) const override {
    double lr = h.at("lr").get<double>(), lr_decay = h.at("lr_decay").get<double>();
    (*out)["grad_sign"] = h.at("maximize").get<bool>() ? -1.0 : 1.0;
    (*out)["weight_decay"] = h.at("weight_decay").get<double>();
    (*out)["clr"] = lr / (1.0 + static_cast<double>(t.step - 1) * lr_decay);
    (*out)["eps"] = h.at("eps").get<double>();
  }

 private:
  std::string type_ = "adagrad";
};

}  // namespace

std::unique_ptr<UpdateRule> make_adagrad() { return std::make_unique<Adagrad>(); }

}  // namespace optfuse::optim
