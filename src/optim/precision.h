#pragma once
// Mixed precision for every optimizer, as a transform of the rule's f32 update graph.
//
// A group's Precision says how its tensors are stored: params f32, bf16, f16 or f64; grads f32,
// bf16 or f16 (f64 with f64 params); optimizer state f32, bf16, or (without master weights) the
// param's 16-bit dtype, or f64 with f64 params. The rule always describes the update in f32; the
// transform adds the conversions, so ONE kernel pass
//   * reads the f32 master copy of a 16-bit param (state "master", created from the param values
//     at its first step) instead of the param, and the grad in its own dtype, widened to f32;
//   * reads 16-bit states widened to f32, computes in f32, and stores them rounded (RNE);
//   * writes the new master (f32) and the param copy rounded to its dtype: round-to-nearest-even,
//     or for bf16 params, stochastic rounding (round_sr) keyed by (rounding_seed, step, tensor).
// With master weights the 16-bit param is written, never read (lowering does not load an input
// nothing reads).
//
// Without master weights ("master_weights": false, torch's own way with 16-bit params: what
// torch.optim.AdamW(fused=True) does on bf16 params) a 16-bit param has no f32 copy: the kernel
// reads the param widened to f32, its state is stored in the param's dtype (whatever
// state_dtype says), and every value is computed in f32 and rounded once to its 16-bit dtype.
// A step then moves 2 + 2 bytes of param instead of 4 + 4 + 2, and 2 per state buffer instead
// of 4, but updates smaller than half a 16-bit ulp of the param are lost (the master copy keeps
// them). Rules that have a torch twin with its own op order compute it that way in this mode
// (UpdateRule::unmastered_graph) so that the rounded values are torch's.
//
// f64 params (torch's float64 params) take f64 grads and keep f64 state: the whole update is
// computed in f64, its host scalars passed unrounded, as torch computes a float64 step.
//
// Group options (accepted by every optimizer, beside torch's):
//   "state_dtype": "f32" (default) or "bf16"
//   "master_weights": true (default) or false; no effect on f32 params (they have no copy)
//   "stochastic_rounding": false (default) or true (bf16 params only; without master weights
//                          it rounds the param itself, the state still rounds to nearest even)
//   "rounding_seed": integer in [0, 2^32) (default 0)
#include <cstdint>
#include <string>
#include <vector>

#include "optfuse/graph.h"
#include "optfuse/optim.h"

namespace optfuse::optim {

struct Precision {
  DType param = DType::F32;
  DType grad = DType::F32;
  DType state = DType::F32;
  bool stochastic = false;
  bool master = true;  // master_weights; only 16-bit params have a copy to keep or drop
  bool low() const { return param == DType::BF16 || param == DType::F16; }
  bool has_master() const { return low() && master; }
  // A 16-bit param updated in its own dtype (master_weights false).
  bool unmastered() const { return low() && !master; }
  // An f64 param: the update computed in f64 throughout.
  bool wide() const { return param == DType::F64; }
  // (`master` matters only for 16-bit params.)
  bool operator==(const Precision& o) const {
    return param == o.param && grad == o.grad && state == o.state && stochastic == o.stochastic &&
           unmastered() == o.unmastered();
  }
};

// The name of the f32 master copy of a 16-bit param, and of the scalar holding round_sr's key.
extern const char* const kMasterState;
extern const char* const kRoundingKey;

// The precision options with their defaults, merged into every optimizer's defaults.
Options precision_defaults();
Options with_precision_defaults(Options rule_defaults);
// Checks the precision options of merged group options `h` (kinds, names, seed range).
void validate_precision(const Options& h, const std::string& where);
// Error unless `t` is a dtype tensors may have (f32, bf16, f16, f64); `what` is "param" or
// "grad".
void check_tensor_dtype(DType t, const char* what, const std::string& where);

// The group's precision from its options and its tensors' dtypes. Throws if stochastic rounding
// is asked for params that are not bf16, or without master weights for state_dtype "bf16" with
// f16 params (the state is then f16), or for f64 params with other grads or a state_dtype.
Precision group_precision(const Options& h, DType param, DType grad, const std::string& where);

class UpdateRule;
// The rule's f32 graph for tensors of precision `p`: UpdateRule::unmastered_graph for 16-bit
// params without master weights, else UpdateRule::graph.
Graph rule_graph(const UpdateRule& rule, const Options& h, const Precision& p);

// The rule's f32 graph rewritten for `p` (unchanged when everything is f32).
Graph apply_precision(const Graph& rule_graph, const Precision& p);

// "master = f32(param)" for a param of dtype `param`: makes a 16-bit param's master copy where
// the param cannot be read on the host (device tensors); the CPU path widens on the host.
Graph master_copy_graph(DType param);

// The state buffers a tensor keeps: the rule's, plus the master copy for 16-bit params.
std::vector<std::string> precision_state_names(std::vector<std::string> rule_names,
                                               const Precision& p);
// The dtype a state buffer is stored in.
DType state_buffer_dtype(const std::string& name, const Precision& p);

// round_sr's key for one tensor and step: a hash of (seed, step, stream), below 2^32. `stream`
// identifies the tensor (tensor_stream), so tensors of a group draw independent bits.
double rounding_key(uint64_t seed, int64_t step, uint32_t stream);
uint32_t tensor_stream(size_t group, size_t index);

// Element conversions for state creation and inspection (round-to-nearest-even).
uint16_t to_bf16_bits(float x);
uint16_t to_f16_bits(float x);
float from_bf16_bits(uint16_t b);
float from_f16_bits(uint16_t b);
// `x` rounded to 16-bit dtype `t` (bf16 or f16), as bits.
uint16_t to_16bit(float x, DType t);
// Widens `n` elements of dtype `t` at `data` to f32 (exact for every 16-bit value; f64 values are
// rounded).
std::vector<float> widen_to_f32(const void* data, DType t, int64_t n);

}  // namespace optfuse::optim
