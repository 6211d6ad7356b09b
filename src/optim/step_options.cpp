#include "optim/step_options.h"

#include <cmath>

#include "optfuse/error.h"
#include "optim/options.h"

namespace optfuse::optim {
namespace {

constexpr const char* kWhere = "optimizer config";

const char* const kNames[] = {
    "max_grad_norm", "norm_type",      "error_if_nonfinite", "loss_scale",         "init_scale",
    "growth_factor", "backoff_factor", "growth_interval",    "accumulation_steps", "accumulation"};

std::string bad(const std::string& what) { return std::string(kWhere) + ": " + what; }

// A JSON number that is an exact integer (1 and 1.0 both count, 1.5 does not).
bool integer_value(const Options& v, int64_t* out) {
  if (v.is_number_integer()) {
    *out = v.get<int64_t>();
    return true;
  }
  if (!v.is_number_float()) return false;
  double d = v.get<double>();
  if (!std::isfinite(d) || d != std::floor(d) || std::fabs(d) > 9.0e15) return false;
  *out = static_cast<int64_t>(d);
  return true;
}

void take_clipping(Options& c, StepOptions* s) {
  if (c.contains("max_grad_norm")) {
    s->max_grad_norm = number(c, "max_grad_norm", kWhere);
    if (s->max_grad_norm < 0)
      throw Error(bad("Invalid max_grad_norm: " + pyfloat(s->max_grad_norm) + " (must be >= 0)"));
  }
  if (c.contains("norm_type")) {
    const Options& v = c.at("norm_type");
    bool two = v.is_number() && v.get<double>() == 2.0;
    bool inf =
        v.is_string() && (v.get<std::string>() == "inf" || v.get<std::string>() == "Infinity");
    if (!two && !inf)
      throw Error(bad("unsupported norm_type " + message_text(v) + " (supported: 2 and \"inf\")"));
    s->norm_inf = inf;
  }
  if (c.contains("error_if_nonfinite"))
    s->error_if_nonfinite = flag(c, "error_if_nonfinite", kWhere);
  for (const char* n : {"norm_type", "error_if_nonfinite"})
    if (c.contains(n) && !s->clipping())
      throw Error(bad(std::string("'") + n + "' needs \"max_grad_norm\" (gradient clipping)"));
}

void take_loss_scale(Options& c, StepOptions* s) {
  if (c.contains("loss_scale")) {
    const Options& v = c.at("loss_scale");
    if (v.is_string() && v.get<std::string>() == "dynamic") {
      s->loss_scale = StepOptions::LossScale::Dynamic;
    } else if (v.is_number()) {
      s->loss_scale = StepOptions::LossScale::Static;
      s->static_scale = v.get<double>();
      if (!std::isfinite(s->static_scale) || s->static_scale <= 0)
        throw Error(bad("Invalid loss_scale: " + pyfloat(s->static_scale) + " (must be > 0)"));
    } else {
      throw Error(bad("loss_scale must be \"dynamic\" or a number > 0, got " + message_text(v)));
    }
  }
  const bool dynamic = s->loss_scale == StepOptions::LossScale::Dynamic;
  for (const char* n : {"init_scale", "growth_factor", "backoff_factor", "growth_interval"})
    if (c.contains(n) && !dynamic)
      throw Error(bad(std::string("'") + n + "' needs \"loss_scale\": \"dynamic\""));
  if (!dynamic) return;
  if (c.contains("init_scale")) s->init_scale = number(c, "init_scale", kWhere);
  if (c.contains("growth_factor")) s->growth_factor = number(c, "growth_factor", kWhere);
  if (c.contains("backoff_factor")) s->backoff_factor = number(c, "backoff_factor", kWhere);
  // torch.cuda.amp.GradScaler's own checks, with its wording.
  if (s->init_scale <= 0)
    throw Error(bad("Invalid init_scale: " + pyfloat(s->init_scale) + " (must be > 0)"));
  if (s->growth_factor <= 1.0)
    throw Error(bad("The growth factor must be > 1.0, got " + pyfloat(s->growth_factor)));
  if (s->backoff_factor >= 1.0 || s->backoff_factor <= 0)
    throw Error(
        bad("The backoff factor must be < 1.0 (and > 0), got " + pyfloat(s->backoff_factor)));
  if (c.contains("growth_interval")) {
    const Options& v = c.at("growth_interval");
    if (!integer_value(v, &s->growth_interval) || s->growth_interval <= 0)
      throw Error(bad("growth_interval must be an integer > 0, got " + message_text(v)));
  }
}

void take_accumulation(Options& c, StepOptions* s) {
  if (c.contains("accumulation_steps")) {
    const Options& v = c.at("accumulation_steps");
    if (!integer_value(v, &s->accumulation_steps) || s->accumulation_steps < 1)
      throw Error(bad("accumulation_steps must be an integer >= 1, got " + message_text(v)));
  }
  if (c.contains("accumulation")) {
    const Options& v = c.at("accumulation");
    if (!v.is_string() || (v.get<std::string>() != "mean" && v.get<std::string>() != "sum"))
      throw Error(bad("accumulation must be \"mean\" or \"sum\", got " + message_text(v)));
    s->accumulation_mean = v.get<std::string>() == "mean";
  }
}

}  // namespace

bool is_step_option(const std::string& name) {
  for (const char* n : kNames)
    if (name == n) return true;
  return false;
}

StepOptions take_step_options(Options* config) {
  StepOptions s;
  if (!config->is_object()) return s;
  Options& c = *config;
  take_clipping(c, &s);
  take_loss_scale(c, &s);
  take_accumulation(c, &s);
  for (const char* n : kNames) c.erase(n);
  return s;
}

void reject_step_options(const Options& overrides, const std::string& where) {
  if (!overrides.is_object()) return;
  for (auto it = overrides.begin(); it != overrides.end(); ++it)
    if (is_step_option(it.key()))
      throw Error(where + ": '" + it.key() +
                  "' is an optimizer-wide option (it applies to the gradients of all groups "
                  "together): give it in the optimizer config");
}

Options StepOptions::to_json() const {
  Options j = Options::object();
  if (clipping()) {
    j["max_grad_norm"] = max_grad_norm;
    j["norm_type"] = norm_inf ? Options("inf") : Options(2.0);
    j["error_if_nonfinite"] = error_if_nonfinite;
  }
  if (loss_scale == LossScale::Static) j["loss_scale"] = static_scale;
  if (loss_scale == LossScale::Dynamic) {
    j["loss_scale"] = "dynamic";
    j["init_scale"] = init_scale;
    j["growth_factor"] = growth_factor;
    j["backoff_factor"] = backoff_factor;
    j["growth_interval"] = growth_interval;
  }
  if (accumulating()) {
    j["accumulation_steps"] = accumulation_steps;
    j["accumulation"] = accumulation_mean ? "mean" : "sum";
  }
  return j;
}

}  // namespace optfuse::optim
