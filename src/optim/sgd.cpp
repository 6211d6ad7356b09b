// torch.optim.SGD: https://pytorch.org/docs/stable/generated/torch.optim.SGD.html
//   g = maximize ? -grad : grad;  g += weight_decay * p
//   if momentum: b = (first step) ? g : momentum * b + (1 - dampening) * g
//                g = nesterov ? g + momentum * b : b
//   p -= lr * g
// grad_centralization (MindSpore's option; Yong et al. 2020): for tensors with >= 2 dims, g -=
// its mean over all dims but the first, after weight decay (the GC paper's SGD_GC order): the
// graph labels that gradient (grad_centralization.h), group_plan.cpp's transform centralizes it.
// Structure (compiled in): whether a momentum buffer exists, Nesterov. Everything else, and the
// first-step special case, are runtime scalars: at the first step buf_decay = 0 and grad_coef = 1
// over a zero-filled buffer, which gives exactly b = g.
#include <cmath>

#include "optfuse/error.h"
#include "optim/grad_centralization.h"
#include "optim/options.h"
#include "optim/rule.h"

namespace optfuse::optim {
namespace {

class Sgd final : public UpdateRule {
 public:
  const std::string& type() const override { return type_; }

  Options defaults() const override {
    return {{"lr", 1e-3},
            {"momentum", 0.0},
            {"dampening", 0.0},
            {"weight_decay", 0.0},
            {"nesterov", false},
            {"maximize", false},
            {"grad_centralization", false}};
  }

  void validate(const Options& h, const std::string& where) const override {
    double lr = number(h, "lr", where), momentum = number(h, "momentum", where);
    double dampening = number(h, "dampening", where), wd = number(h, "weight_decay", where);
    bool nesterov = flag(h, "nesterov", where);
    flag(h, "maximize", where);
    flag(h, "grad_centralization", where);
    if (lr < 0) throw Error(where + ": Invalid learning rate: " + pyfloat(lr));
    if (momentum < 0) throw Error(where + ": Invalid momentum value: " + pyfloat(momentum));
    if (wd < 0) throw Error(where + ": Invalid weight_decay value: " + pyfloat(wd));
    if (nesterov && (momentum <= 0 || dampening != 0))
      throw Error(where + ": Nesterov momentum requires a momentum and zero dampening");
  }

  std::optional<std::vector<std::string>> graph_options() const override {
    return std::vector<std::string>{"momentum", "nesterov"};
  }

  Graph graph(const Options& h) const override {
    bool momentum = has_momentum(h), nesterov = h.at("nesterov").get<bool>();
    Graph gr(std::string("sgd") + (momentum ? (nesterov ? "_nesterov" : "_momentum") : ""));
    Value p = gr.param("param"), g = gr.grad("grad");
    Value d = gr.scalar("grad_sign") * g + gr.scalar("weight_decay") * p;
    d = effective_grad(d);  // (where gradient centralization applies)
    if (momentum) {
      Value b = gr.state("momentum_buffer");
      Value b_new = gr.scalar("buf_decay") * b + gr.scalar("grad_coef") * d;
      gr.output("momentum_buffer", b_new);
      d = nesterov ? d + gr.scalar("momentum") * b_new : b_new;
    }
    gr.output("param", p - gr.scalar("lr") * d);
    return gr;
  }

  void scalars(const Options& h, const TensorStep& t,
               std::map<std::string, double>* out) const override {
    double momentum = h.at("momentum").get<double>();
    (*out)["lr"] = h.at("lr").get<double>();
    (*out)["weight_decay"] = h.at("weight_decay").get<double>();
    (*out)["grad_sign"] = h.at("maximize").get<bool>() ? -1.0 : 1.0;
    (*out)["momentum"] = momentum;
    (*out)["buf_decay"] = t.state_created_now ? 0.0 : momentum;
    (*out)["grad_coef"] = t.state_created_now ? 1.0 : 1.0 - h.at("dampening").get<double>();
  }

 private:
  static bool has_momentum(const Options& h) { return h.at("momentum").get<double>() != 0.0; }
  std::string type_ = "sgd";
};

}  // namespace

std::unique_ptr<UpdateRule> make_sgd() { return std::make_unique<Sgd>(); }

}  // namespace optfuse::optim
