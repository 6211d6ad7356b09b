#include "optim/precision.h"

#include <cmath>
#include <cstring>
#include <map>

#include "optfuse/error.h"
#include "optim/block_state.h"
#include "optim/grad_prologue.h"
#include "optim/graph_copy.h"
#include "optim/options.h"
#include "optim/rule.h"

namespace optfuse::optim {

const char* const kMasterState = "master";
const char* const kRoundingKey = "rounding_key";

Options precision_defaults() {
  Options h = {{"state_dtype", "f32"},
               {"master_weights", true},
               {"stochastic_rounding", false},
               {"rounding_seed", 0}};
  h.update(blocking_defaults());  // int8 state's block_size and min_8bit_size (block_state.h)
  return h;
}

Options with_precision_defaults(Options rule_defaults) {
  const Options defaults = precision_defaults();  // named: items() would dangle on a temporary
  for (auto it = defaults.begin(); it != defaults.end(); ++it) rule_defaults[it.key()] = *it;
  return rule_defaults;
}

void validate_precision(const Options& h, const std::string& where) {
  const Options& sd = h.at("state_dtype");
  if (!sd.is_string() || (sd != "f32" && sd != "bf16" && sd != "int8"))
    throw Error(where + ": option 'state_dtype' must be \"f32\", \"bf16\" or \"int8\", got " +
                message_text(sd));
  validate_blocking(h, where);
  flag(h, "stochastic_rounding", where);
  flag(h, "master_weights", where);
  double seed = number(h, "rounding_seed", where);
  if (seed < 0 || seed >= 4294967296.0 || seed != std::floor(seed))
    throw Error(where + ": option 'rounding_seed' must be an integer in [0, 2^32), got " +
                pyfloat(seed));
}

void check_tensor_dtype(DType t, const char* what, const std::string& where) {
  if (t == DType::F32 || t == DType::BF16 || t == DType::F16 || t == DType::F64) return;
  throw Error(where + ": " + what + " dtype " + std::string(dtype_name(t)) +
              " is not supported (params and grads are f32, bf16, f16 or f64)");
}

Precision group_precision(const Options& h, DType param, DType grad, const std::string& where) {
  Precision p;
  p.param = param;
  p.grad = grad;
  p.state = h.at("state_dtype") == "bf16" ? DType::BF16 : DType::F32;
  p.stochastic = h.at("stochastic_rounding").get<bool>();
  p.master = h.at("master_weights").get<bool>();
  if (p.stochastic && param != DType::BF16)
    throw Error(where + ": stochastic_rounding needs bf16 params, the params are " +
                std::string(dtype_name(param)));
  if (param == DType::F64 || grad == DType::F64) {
    if (param != grad)
      throw Error(where + ": " + std::string(dtype_name(param)) + " params with " +
                  std::string(dtype_name(grad)) +
                  " grads: f64 params take f64 grads (and f64 grads f64 params)");
    if (h.at("state_dtype") != "f32")
      throw Error(where + ": state_dtype " + h.at("state_dtype").dump() +
                  " with f64 params: their state is f64, computed and stored as the params");
    p.state = DType::F64;
    return p;
  }
  if (p.unmastered()) {
    if (h.at("state_dtype") == "int8")
      throw Error(where + ": state_dtype \"int8\" with master_weights false and " +
                  std::string(dtype_name(param)) +
                  " params: without master weights the state is stored in the params' dtype; " +
                  "8-bit state needs master weights");
    if (p.state == DType::BF16 && param != DType::BF16)
      throw Error(where + ": state_dtype \"bf16\" with master_weights false and " +
                  std::string(dtype_name(param)) +
                  " params: without master weights the state is stored in the params' dtype");
    p.state = param;
  }
  return p;
}

namespace {

// Copies `in` node by node into a new graph, changing how tensors are stored (see precision.h).
class PrecisionRewriter {
 public:
  PrecisionRewriter(const Graph& in, const Precision& p) : in_(in), p_(p), out_(name(in, p)) {}

  Graph run() { return copy_graph(in_, out_, *this); }

  // copy_graph's steps.
  static std::string name(const Graph& in, const Precision& p) {
    std::string s = in.name();
    if (p.param != DType::F32)
      s += "_" + std::string(dtype_name(p.param)) + (p.stochastic ? "sr" : "") +
           (p.master ? "" : "nm");
    if (p.grad != DType::F32) s += "_g" + std::string(dtype_name(p.grad));
    if (p.state != DType::F32) s += "_s" + std::string(dtype_name(p.state));
    return s;
  }

  NodeId input(Node n) {
    if (n.dtype != DType::F32)
      internal_error("precision: rule graph input '" + n.name + "' is not f32");
    switch (n.role) {
      case Role::Param:
        if (p_.param == DType::F32) break;
        if (!param_name_.empty()) internal_error("precision: rule graph has two params");
        param_name_ = n.name;
        if (p_.unmastered()) return widened(out_.param(n.name, p_.param));
        out_.param(n.name, p_.param);  // written only
        return out_.state(kMasterState, DType::F32).id();
      case Role::Grad:
        return widened(out_.grad(n.name, p_.grad));
      case Role::State:
        if (n.name == kMasterState) internal_error("precision: rule state named 'master'");
        return widened(out_.state(n.name, state_buffer_dtype(n.name, p_)));
      case Role::RowState:  // one value per row or column (Adafactor's factored moments)
      case Role::ColState:
        return widened(out_.input(n.role, n.name, state_buffer_dtype(n.name, p_)));
    }
    return out_.add_node(std::move(n));
  }

  NodeId widened(Value v) {
    return v.node().dtype == DType::F32 ? v.id() : cast(v, DType::F32).id();
  }

  void store(const Output& o, Value v) {
    if (o.replaces == param_name_) {
      if (p_.has_master()) out_.output(kMasterState, v);
      Value low =
          p_.stochastic ? round_sr(v, out_.scalar(kRoundingKey, DType::F64)) : cast(v, p_.param);
      out_.output(o.replaces, low);
      return;
    }
    NodeId in = in_.find_input(o.replaces);
    const Role role = in >= 0 ? in_.node(in).role : Role::Param;
    bool state = role == Role::State || role == Role::RowState || role == Role::ColState;
    out_.output(o.replaces, state && p_.state != DType::F32 ? cast(v, p_.state) : v);
  }

 private:
  const Graph& in_;
  const Precision& p_;
  Graph out_;
  std::string param_name_;  // the rule's param input, when it is 16-bit
};

// Copies `in` with every f32 value made f64: the inputs, scalars, constants and ops (a cast to
// f32 becomes one to f64), so the update is computed in f64 throughout.
class WideningRewriter {
 public:
  explicit WideningRewriter(const Graph& in) : in_(in), out_(in.name() + "_f64") {}

  Graph run() {
    std::vector<NodeId> to_out;
    for (Node n : in_.nodes()) {
      if (n.dtype == DType::F32) n.dtype = DType::F64;
      for (NodeId& a : n.args) a = to_out[a];
      to_out.push_back(out_.add_node(std::move(n)));
    }
    for (const Output& o : in_.outputs()) out_.output(o.replaces, out_.value(to_out[o.value]));
    for (const Result& r : in_.results()) out_.result(r.name, out_.value(to_out[r.value]));
    return std::move(out_);
  }

 private:
  const Graph& in_;
  Graph out_;
};

}  // namespace

Graph master_copy_graph(DType param) {
  Graph gr("master_copy_" + std::string(dtype_name(param)));
  Value master = gr.state(kMasterState, DType::F32), p = gr.param("param", param);
  (void)master;  // written, never read
  gr.output(kMasterState, cast(p, DType::F32));
  return gr;
}

Graph rule_graph(const UpdateRule& rule, const Options& h, const Precision& p) {
  return p.unmastered() ? rule.unmastered_graph(h) : rule.graph(h);
}

Graph apply_precision(const Graph& rule_graph, const Precision& p) {
  if (p.param == DType::F32 && p.grad == DType::F32 && p.state == DType::F32) return rule_graph;
  if (p.wide()) return WideningRewriter(rule_graph).run();
  return PrecisionRewriter(rule_graph, p).run();
}

std::vector<std::string> precision_state_names(std::vector<std::string> rule_names,
                                               const Precision& p) {
  if (p.has_master()) rule_names.push_back(kMasterState);
  return rule_names;
}

DType state_buffer_dtype(const std::string& name, const Precision& p) {
  if (p.wide()) return DType::F64;
  // The accumulation buffer stays f32 whatever the state dtype: it sums k gradients.
  return name == kMasterState || name == kGradAccum ? DType::F32 : p.state;
}

namespace {

// SplitMix64's finalizer: a bijection on 64 bits with full avalanche.
uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

double rounding_key(uint64_t seed, int64_t step, uint32_t stream) {
  uint64_t h = mix64(seed + 0x9e3779b97f4a7c15ull);
  h = mix64(h ^ static_cast<uint64_t>(step));
  h = mix64(h ^ stream);
  return static_cast<double>(h >> 32);  // an integer below 2^32: exact in the f64 scalar
}

uint32_t tensor_stream(size_t group, size_t index) {
  return static_cast<uint32_t>(mix64((uint64_t(group) << 32) ^ uint64_t(index)));
}

uint16_t to_bf16_bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  if (std::isnan(x)) return static_cast<uint16_t>((b >> 16) | 0x40);  // stays a (quiet) NaN
  b += 0x7fffu + ((b >> 16) & 1u);  // round to nearest, ties to even
  return static_cast<uint16_t>(b >> 16);
}

uint16_t to_f16_bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, 4);
  const uint16_t sign = static_cast<uint16_t>((b >> 16) & 0x8000u);
  const uint32_t abs = b & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7e00u;   // NaN: a quiet NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00u;  // rounds to 65520 or more: inf
  if (abs < 0x38800000u) {                        // below 2^-14: an f16 subnormal or zero
    // x * 2^24 rounded to an integer (ties to even) is the subnormal's fraction.
    float scaled = std::fabs(x) * 16777216.0f;  // exact: a power-of-two scale
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));
  }
  // A normal f16: drop 13 fraction bits, round to nearest even; a carry may bump the exponent.
  uint32_t r = abs + 0xfffu + ((abs >> 13) & 1u);
  return sign | static_cast<uint16_t>((r - 0x38000000u) >> 13);
}

uint16_t to_16bit(float x, DType t) {
  if (t == DType::BF16) return to_bf16_bits(x);
  if (t == DType::F16) return to_f16_bits(x);
  internal_error("to_16bit: dtype " + std::string(dtype_name(t)) + " is not 16-bit");
}

float from_bf16_bits(uint16_t h) {
  uint32_t b = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

float from_f16_bits(uint16_t h) {
  int sign = (h >> 15) & 1, exp = (h >> 10) & 0x1f, frac = h & 0x3ff;
  float mag;
  if (exp == 0)
    mag = std::ldexp(static_cast<float>(frac), -24);  // subnormal
  else if (exp == 31)
    mag = frac ? NAN : INFINITY;
  else
    mag = std::ldexp(static_cast<float>(frac | 0x400), exp - 25);
  return sign ? -mag : mag;
}

std::vector<float> widen_to_f32(const void* data, DType t, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  if (t == DType::F32) {
    std::memcpy(out.data(), data, out.size() * sizeof(float));
    return out;
  }
  if (t == DType::F64) {  // (rounded: f64 state seen as f32, state_values)
    const auto* d = static_cast<const double*>(data);
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(d[i]);
    return out;
  }
  if (t == DType::U8) {
    const auto* c = static_cast<const uint8_t*>(data);
    for (size_t i = 0; i < out.size(); ++i) out[i] = c[i];
    return out;
  }
  const auto* h = static_cast<const uint16_t*>(data);
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = t == DType::BF16 ? from_bf16_bits(h[i]) : from_f16_bits(h[i]);
  return out;
}

}  // namespace optfuse::optim
