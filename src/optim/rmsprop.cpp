// torch.optim.RMSprop: https://pytorch.org/docs/stable/generated/torch.optim.RMSprop.html
//   g = maximize ? -grad : grad;  g += weight_decay * p
//   v = alpha * v + (1 - alpha) * g * g                          (square_avg)
//   centered: m = lerp(m, g, 1 - alpha);  avg = sqrt(v - m * m) + eps   (grad_avg)
//   else:     avg = sqrt(v) + eps
//   momentum > 0: b = momentum * b + g / avg;  p = p - lr * b       (momentum_buffer, from zeros)
//   else:         p = p - lr * (g / avg)
// Structure (compiled in): centered, momentum > 0 (torch creates grad_avg / momentum_buffer only
// then). Values of lr, alpha, eps, weight_decay, momentum are runtime scalars.
#include "optfuse/error.h"
#include "optim/options.h"
#include "optim/rule.h"

namespace optfuse::optim {
namespace {

class Rmsprop final : public UpdateRule {
 public:
  const std::string& type() const override { return type_; }

  Options defaults() const override {
    return {{"lr", 1e-2},      {"alpha", 0.99},     {"eps", 1e-8},      {"weight_decay", 0.0},
            {"momentum", 0.0}, {"centered", false}, {"maximize", false}};
  }

  void validate(const Options& h, const std::string& where) const override {
    double lr = number(h, "lr", where), alpha = number(h, "alpha", where);
    double eps = number(h, "eps", where), wd = number(h, "weight_decay", where);
    double momentum = number(h, "momentum", where);
    flag(h, "centered", where);
    flag(h, "maximize", where);
    if (lr < 0) throw Error(where + ": Invalid learning rate: " + pyfloat(lr));
    if (eps < 0) throw Error(where + ": Invalid epsilon value: " + pyfloat(eps));
    if (momentum < 0) throw Error(where + ": Invalid momentum value: " + pyfloat(momentum));
    if (wd < 0) throw Error(where + ": Invalid weight_decay value: " + pyfloat(wd));
    if (alpha < 0) throw Error(where + ": Invalid alpha value: " + pyfloat(alpha));
  }

  std::optional<std::vector<std::string>> graph_options() const override {
    return std::vector<std::string>{"centered", "momentum"};
  }

  Graph graph(const Options& h) const override {
    bool c = centered(h), momentum = has_momentum(h);
    Graph gr(std::string("rmsprop") + (c ? "_centered" : "") + (momentum ? "_momentum" : ""));
    Value p = gr.param("param"), v = gr.state("square_avg");
    Value g = gr.scalar("grad_sign") * gr.grad("grad") + gr.scalar("weight_decay") * p;
    Value one_minus_alpha = gr.scalar("one_minus_alpha");
    Value v_new = gr.scalar("alpha") * v + one_minus_alpha * (g * g);
    gr.output("square_avg", v_new);
    Value var = v_new;
    if (c) {
      Value m = gr.state("grad_avg");
      Value m_new = m + one_minus_alpha * (g - m);
      gr.output("grad_avg", m_new);
      var = v_new - m_new * m_new;
    }
    Value avg = sqrt(var) + gr.scalar("eps");
    Value d = g / avg;
    if (momentum) {
      Value b_new = gr.scalar("momentum") * gr.state("momentum_buffer") + d;
      gr.output("momentum_buffer", b_new);
      d = b_new;
    }
    gr.output("param", p - gr.scalar("lr") * d);
    return gr;
  }

  void scalars(const Options& h, const TensorStep&,
               std::map<std::string, double>* out) const override {
    double alpha = h.at("alpha").get<double>();
    (*out)["grad_sign"] = h.at("maximize").get<bool>() ? -1.0 : 1.0;
    (*out)["weight_decay"] = h.at("weight_decay").get<double>();
    (*out)["alpha"] = alpha;
    (*out)["one_minus_alpha"] = 1.0 - alpha;
    (*out)["eps"] = h.at("eps").get<double>();
    (*out)["momentum"] = h.at("momentum").get<double>();
    (*out)["lr"] = h.at("lr").get<double>();
  }

 private:
  static bool centered(const Options& h) { return h.at("centered").get<bool>(); }
  static bool has_momentum(const Options& h) { return h.at("momentum").get<double>() > 0.0; }
  std::string type_ = "rmsprop";
};

}  // namespace

std::unique_ptr<UpdateRule> make_rmsprop() { return std::make_unique<Rmsprop>(); }

}  // namespace optfuse::optim
