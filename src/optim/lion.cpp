// Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"; not in torch.optim),
// as lucidrains/lion-pytorch implements it:
//   p = p * (1 - lr * weight_decay)
//   update = sign(beta1 * m + (1 - beta1) * g)              (sign(0) = 0)
//   p = p - lr * update
//   m = beta2 * m + (1 - beta2) * g                          (exp_avg, from zeros)
// Validation uses torch's wording for the same checks as Adam. One structure.
#include "optim/adam_family.h"
#include "optim/rule.h"

namespace optfuse::optim {
namespace {

class Lion final : public UpdateRule {
 public:
  const std::string& type() const override { return type_; }

  Options defaults() const override {
    return {{"lr", 1e-4}, {"betas", {0.9, 0.99}}, {"weight_decay", 0.0}};
  }

  void validate(const Options& h, const std::string& where) const override {
    validate_adam_like(h, where, /*has_eps=*/false);
  }

  std::optional<std::vector<std::string>> graph_options() const override {
    return std::vector<std::string>{};  // scalars only
  }

  Graph graph(const Options&) const override {
    Graph gr("lion");
    Value p = gr.param("param"), m = gr.state("exp_avg"), g = gr.grad("grad");
    Value update = sign(gr.scalar("beta1") * m + gr.scalar("one_minus_beta1") * g);
    gr.output("param", p * gr.scalar("decay") - gr.scalar("lr") * update);
    gr.output("exp_avg", gr.scalar("beta2") * m + gr.scalar("one_minus_beta2") * g);
    return gr;
  }

  void scalars(const Options& h, const TensorStep&,
               std::map<std::string, double>* out) const override {
    double lr = h.at("lr").get<double>();
    double b1 = h.at("betas")[0].get<double>(), b2 = h.at("betas")[1].get<double>();
    (*out)["lr"] = lr;
    (*out)["decay"] = 1.0 - lr * h.at("weight_decay").get<double>();
    (*out)["beta1"] = b1;
    (*out)["one_minus_beta1"] = 1.0 - b1;
    (*out)["beta2"] = b2;
    (*out)["one_minus_beta2"] = 1.0 - b2;
  }

 private:
  std::string type_ = "lion";
};

}  // namespace

std::unique_ptr<UpdateRule> make_lion() { return std::make_unique<Lion>(); }

}  // namespace optfuse::optim
