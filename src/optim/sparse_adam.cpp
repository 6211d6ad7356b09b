// torch.optim.SparseAdam ("lazy Adam"), for row-sparse gradients: only the rows present in the
// step's gradient update their rows of param, exp_avg and exp_avg_sq (the others keep their
// values, moments included); state['step'] still counts every step. Per touched element, as
// torch computes it:
//   g = maximize ? -grad : grad
//   m' = m + (1 - beta1) (g - m)             v' = v + (1 - beta2) (g^2 - v)
//   p -= lr sqrt(1 - beta2^t) / (1 - beta1^t) * m' / (sqrt(v') + eps)
// The kernel is an ordinary dense kernel; Optimizer::step calls it once per run of consecutive
// rows (run_sparse, sparse_grad.h), so the cost is proportional to the rows touched.
#include <cmath>

#include "optfuse/error.h"
#include "optim/options.h"
#include "optim/rule.h"

namespace optfuse::optim {
namespace {

class SparseAdam final : public UpdateRule {
 public:
  const std::string& type() const override { return type_; }
  bool sparse_grads() const override { return true; }

  Options defaults() const override {
    return {{"lr", 1e-3}, {"betas", {0.9, 0.999}}, {"eps", 1e-8}, {"maximize", false}};
  }

  void validate(const Options& h, const std::string& where) const override {
    double lr = number(h, "lr", where), eps = number(h, "eps", where);
    auto [b1, b2] = pair(h, "betas", where);
    flag(h, "maximize", where);
    if (lr < 0) throw Error(where + ": Invalid learning rate: " + pyfloat(lr));
    if (eps < 0) throw Error(where + ": Invalid epsilon value: " + pyfloat(eps));
    if (b1 < 0 || b1 >= 1)
      throw Error(where + ": Invalid beta parameter at index 0: " + pyfloat(b1));
    if (b2 < 0 || b2 >= 1)
      throw Error(where + ": Invalid beta parameter at index 1: " + pyfloat(b2));
  }

  std::optional<std::vector<std::string>> graph_options() const override {
    return std::vector<std::string>{};  // scalars only
  }

  Graph graph(const Options&) const override {
    Graph gr("sparseadam");
    Value p = gr.param("param"), m = gr.state("exp_avg"), v = gr.state("exp_avg_sq");
    Value g = gr.scalar("grad_sign") * gr.grad("grad");
    Value m_new = m + gr.scalar("one_minus_beta1") * (g - m);
    Value v_new = v + gr.scalar("one_minus_beta2") * (g * g - v);
    gr.output("exp_avg", m_new);
    gr.output("exp_avg_sq", v_new);
    gr.output("param", p - gr.scalar("step_size") * (m_new / (sqrt(v_new) + gr.scalar("eps"))));
    return gr;
  }

  void scalars(const Options& h, const TensorStep& t,
               std::map<std::string, double>* out) const override {
    double b1 = h.at("betas")[0].get<double>(), b2 = h.at("betas")[1].get<double>();
    double step = static_cast<double>(t.step);
    (*out)["grad_sign"] = h.at("maximize").get<bool>() ? -1.0 : 1.0;
    (*out)["one_minus_beta1"] = 1.0 - b1;
    (*out)["one_minus_beta2"] = 1.0 - b2;
    (*out)["eps"] = h.at("eps").get<double>();
    (*out)["step_size"] =
        h.at("lr").get<double>() * std::sqrt(1.0 - std::pow(b2, step)) / (1.0 - std::pow(b1, step));
  }

 private:
  std::string type_ = "sparseadam";
};

}  // namespace

std::unique_ptr<UpdateRule> make_sparse_adam() { return std::make_unique<SparseAdam>(); }

}  // namespace optfuse::optim
