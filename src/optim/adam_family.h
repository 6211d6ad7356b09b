#pragma once
// What Adam, AdamW, Adamax, NAdam, RAdam (and Lion's checks) share, written once: torch's
// validation of lr / betas / eps / weight_decay, the first- and second-moment subgraph, and the
// host scalars those use.
#include <map>
#include <string>

#include "optfuse/graph.h"
#include "optfuse/optim.h"

namespace optfuse::optim {

// torch's checks: lr >= 0, eps >= 0 (when `has_eps`), 0 <= beta < 1 for both betas,
// weight_decay >= 0, and the kinds of every option these optimizers have.
void validate_adam_like(const Options& h, const std::string& where, bool has_eps = true);

// The shared front of the update: g = grad_sign * grad; then L2 weight decay (g += wd * p) or,
// when `decoupled`, p *= decay (= 1 - lr * wd); m' = lerp(m, g, 1 - beta1) (torch's lerp for a
// weight below 0.5); v' = beta2 * v + (1 - beta2) * g * g. Declares exp_avg' and exp_avg_sq' as
// outputs; the caller finishes the param update from the returned values. g is labelled the
// effective gradient (grad_centralization.h): after the weight decay, before the moments.
struct Moments {
  Value p;  // the param, decayed when decoupled
  Value g;  // the gradient as the moments see it
  Value m;  // exp_avg after this step
  Value v;  // exp_avg_sq after this step
};
Moments adam_moments(Graph& gr, bool decoupled);

// The host scalars adam_moments() reads (grad_sign, weight_decay, decay, one_minus_beta1, beta2,
// one_minus_beta2) and eps, each computed in double.
void adam_moment_scalars(const Options& h, std::map<std::string, double>* out);

}  // namespace optfuse::optim
