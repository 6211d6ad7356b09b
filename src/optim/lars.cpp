// LARS (You et al. 2017, "Large Batch Training of Convolutional Networks"), per tensor, as
// torchlars (kakaobrain) wraps torch.optim.SGD:
//   local_lr = trust_coefficient * ||p|| / (||g|| + weight_decay * ||p|| + eps),
//              and 1 when ||p|| or ||g|| is 0
//   d = local_lr * (g + weight_decay * p)
//   momentum: b = (first step) ? d : momentum * b + d;  d = b      (torch SGD, dampening 0)
//   p = p - lr * d
// ONE kernel: ||p|| and ||g|| are reductions (prologue stages; double accumulation, rounded once
// to f32), the update an element-wise pass. Structure: whether a momentum buffer exists.
#include "optfuse/error.h"
#include "optim/options.h"
#include "optim/rule.h"

namespace optfuse::optim {
namespace {

class Lars final : public UpdateRule {
 public:
  const std::string& type() const override { return type_; }

  Options defaults() const override {
    return {{"lr", 0.1},
            {"momentum", 0.9},
            {"weight_decay", 0.0},
            {"trust_coefficient", 0.001},
            {"eps", 1e-8}};
  }

  void validate(const Options& h, const std::string& where) const override {
    double lr = number(h, "lr", where), momentum = number(h, "momentum", where);
    double wd = number(h, "weight_decay", where);
    double trust = number(h, "trust_coefficient", where), eps = number(h, "eps", where);
    if (lr < 0) throw Error(where + ": Invalid learning rate: " + pyfloat(lr));
    if (momentum < 0) throw Error(where + ": Invalid momentum value: " + pyfloat(momentum));
    if (wd < 0) throw Error(where + ": Invalid weight_decay value: " + pyfloat(wd));
    if (trust < 0) throw Error(where + ": Invalid trust_coefficient value: " + pyfloat(trust));
    if (eps < 0) throw Error(where + ": Invalid epsilon value: " + pyfloat(eps));
  }

  std::optional<std::vector<std::string>> graph_options() const override {
    return std::vector<std::string>{"momentum"};
  }

  Graph graph(const Options& h) const override {
    Graph gr(has_momentum(h) ? "lars_momentum" : "lars");
    Value p = gr.param("param"), g = gr.grad("grad");
    Value wd = gr.scalar("weight_decay");
    Value p_sq = sum_squares(p), g_sq = sum_squares(g);
    Value one = gr.constant(1.0), zero = gr.constant(0.0);
    Value p_norm = sqrt(p_sq);
    Value ratio =
        gr.scalar("trust_coefficient") * p_norm / (sqrt(g_sq) + wd * p_norm + gr.scalar("eps"));
    Value local_lr = select(p_sq > zero, select(g_sq > zero, ratio, one), one);
    Value d = local_lr * (g + wd * p);
    if (has_momentum(h)) {
      Value b = gr.scalar("buf_decay") * gr.state("momentum_buffer") + d;
      gr.output("momentum_buffer", b);
      d = b;
    }
    gr.output("param", p - gr.scalar("lr") * d);
    return gr;
  }

  void scalars(const Options& h, const TensorStep& t,
               std::map<std::string, double>* out) const override {
    (*out)["lr"] = h.at("lr").get<double>();
    (*out)["weight_decay"] = h.at("weight_decay").get<double>();
    (*out)["trust_coefficient"] = h.at("trust_coefficient").get<double>();
    (*out)["eps"] = h.at("eps").get<double>();
    // First step over a zero-filled buffer: b = d exactly.
    (*out)["buf_decay"] = t.state_created_now ? 0.0 : h.at("momentum").get<double>();
  }

 private:
  static bool has_momentum(const Options& h) { return h.at("momentum").get<double>() != 0; }
  std::string type_ = "lars";
};

}  // namespace

std::unique_ptr<UpdateRule> make_lars() { return std::make_unique<Lars>(); }

}  // namespace optfuse::optim
