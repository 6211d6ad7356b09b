#pragma once
// 8-bit block-quantized optimizer state, as a transform of an update graph (docs/int8-state.md).
//
// Each chosen f32 state tensor `s` becomes two buffers: `s` itself as u8 codes, one per element,
// and row state `s.absmax`, one f32 per block, where a block is a row of the per-row view
// (KernelCall::cols elements; the last block of a tensor is a call of its own when it is
// shorter). The kernel decodes a block, updates it in f32, takes the new block's absmax (a row
// reduction, computed in the block's loop) and encodes the new values with it: one pass, and
// nothing of a block goes back to memory but its codes and its scale.
//
// The maps (chosen from evidence: bench/python/int8_state_study.md):
//   * kSignedLinear, for signed state (Adam's exp_avg, momentum buffers):
//       code = trunc(127 x / absmax + 127.5), x = (code - 127) absmax / 127;
//     codes 0..254, 127 is zero, and the rounding is to nearest (ties up).
//   * kSqrt, for state that is never negative (exp_avg_sq): absmax = max x and
//       code = trunc(255 sqrt(x / absmax) + 0.5), x = (code sqrt(absmax) / 255)^2;
//     a linear map of sqrt(x), the quantity Adam divides by. A linear map of x itself rounds
//     the small values of a block to 0 and training diverges.
// A block whose absmax is 0 stores codes of zero (127, resp. 0) and decodes to zeros. A block
// holding inf or NaN has a NaN scale (the row reduction propagates NaN) and decodes to NaN.
#include <string>
#include <vector>

#include "optfuse/graph.h"

namespace optfuse::optim {

enum class BlockMap { kSignedLinear, kSqrt };

struct BlockState {
  std::string name;  // an f32 state input of the graph
  BlockMap map;
};

// The name of state `s`'s per-block scales.
std::string block_scale_name(const std::string& state);

// `g` with each state in `which` stored as 8-bit codes with per-block scales. Error if a name is
// not an f32 state input that the graph replaces, or the graph cannot be per-row (it has
// whole-tensor reductions or per-row reductions already).
Graph quantize_state(const Graph& g, const std::vector<BlockState>& which);

}  // namespace optfuse::optim
