#include "optim/adam_family.h"

#include "optfuse/error.h"
#include "optim/grad_centralization.h"
#include "optim/options.h"

namespace optfuse::optim {

void validate_adam_like(const Options& h, const std::string& where, bool has_eps) {
  double lr = number(h, "lr", where), wd = number(h, "weight_decay", where);
  auto [b1, b2] = pair(h, "betas", where);
  for (const char* f : {"maximize", "amsgrad", "decoupled_weight_decay", "grad_centralization"})
    if (h.contains(f)) flag(h, f, where);
  if (lr < 0) throw Error(where + ": Invalid learning rate: " + pyfloat(lr));
  if (has_eps) {
    double eps = number(h, "eps", where);
    if (eps < 0) throw Error(where + ": Invalid epsilon value: " + pyfloat(eps));
  }
  if (b1 < 0 || b1 >= 1) throw Error(where + ": Invalid beta parameter at index 0: " + pyfloat(b1));
  if (b2 < 0 || b2 >= 1) throw Error(where + ": Invalid beta parameter at index 1: " + pyfloat(b2));
  if (wd < 0) throw Error(where + ": Invalid weight_decay value: " + pyfloat(wd));
}

Moments adam_moments(Graph& gr, bool decoupled) {
  Value p = gr.param("param"), m = gr.state("exp_avg"), v = gr.state("exp_avg_sq");
  Value g = gr.scalar("grad_sign") * gr.grad("grad");
  if (decoupled)
    p = p * gr.scalar("decay");
  else
    g = g + gr.scalar("weight_decay") * p;
  g = effective_grad(g);  // (where gradient centralization applies)
  Value m_new = m + gr.scalar("one_minus_beta1") * (g - m);
  Value v_new = gr.scalar("beta2") * v + gr.scalar("one_minus_beta2") * (g * g);
  gr.output("exp_avg", m_new);
  gr.output("exp_avg_sq", v_new);
  return {p, g, m_new, v_new};
}

void adam_moment_scalars(const Options& h, std::map<std::string, double>* out) {
  double lr = h.at("lr").get<double>(), wd = h.at("weight_decay").get<double>();
  double b1 = h.at("betas")[0].get<double>(), b2 = h.at("betas")[1].get<double>();
  (*out)["grad_sign"] = h.value("maximize", false) ? -1.0 : 1.0;
  (*out)["weight_decay"] = wd;
  (*out)["decay"] = 1.0 - lr * wd;
  (*out)["one_minus_beta1"] = 1.0 - b1;
  (*out)["beta2"] = b2;
  (*out)["one_minus_beta2"] = 1.0 - b2;
  if (h.contains("eps")) (*out)["eps"] = h.at("eps").get<double>();
}

}  // namespace optfuse::optim
