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
// holding inf or NaN gets an inf or NaN scale (the row maximum propagates both) and decodes to
// inf or NaN: non-finite state stays non-finite, as it would in f32.
#include <cstdint>
#include <string>
#include <vector>

#include "optfuse/graph.h"
#include "optfuse/optim.h"

namespace optfuse::optim {

enum class BlockMap { kSignedLinear, kSqrt };

struct BlockState {
  std::string name;  // an f32 state input of the graph
  BlockMap map;
};

// The name of state `s`'s per-block scales, and the state a name's scales belong to (the name
// itself if it names no scales).
std::string block_scale_name(const std::string& state);
std::string block_state_of(const std::string& name);

// `g` with each state in `which` stored as 8-bit codes with per-block scales. Error if a name is
// not an f32 state input that the graph replaces, or the graph cannot be per-row (it has
// whole-tensor reductions or per-row reductions already).
Graph quantize_state(const Graph& g, const std::vector<BlockState>& which);

// ---- The group options (merged into every optimizer's defaults with the precision ones) ------
//   "state_dtype": "int8"   the rule's state of tensors of at least min_8bit_size elements as
//                           8-bit codes plus one f32 scale per block (the master copy and the
//                           accumulation buffer stay f32)
//   "block_size": 256       elements per block: a multiple of 16 in [16, 4096]
//   "min_8bit_size": 4096   smaller tensors keep f32 state (bitsandbytes' default)
struct Blocking {
  int64_t block = 0;  // 0: state_dtype is not "int8"
  int64_t min_size = 0;
  bool on() const { return block > 0; }
  // Whether a tensor of `numel` elements keeps 8-bit state.
  bool applies(int64_t numel) const { return block > 0 && numel >= min_size; }
  bool operator==(const Blocking& o) const { return block == o.block && min_size == o.min_size; }
};
Options blocking_defaults();
// Error naming the group and the value unless block_size and min_8bit_size are acceptable.
void validate_blocking(const Options& h, const std::string& where);
Blocking group_blocking(const Options& h);

// The states of `g` that 8-bit state stores as codes: every f32 state the graph writes but the
// master copy and the accumulation buffer. Known non-negative state (exp_avg_sq, square_avg,
// sum, exp_inf, ...) gets the square-root map, all other the signed linear one.
std::vector<BlockState> blocked_states(const Graph& g);
// The map blocked_states() gives a state of this name.
BlockMap block_map(const std::string& state);

// ---- The maps on the host, in f32 as the kernel computes them ------------------------------
// For new state, conversions between state dtypes, and reading 8-bit state. A value may encode
// one code away from the kernel's (which may fuse a multiply-add): both are the map's rounding.
int64_t block_count(int64_t n, int64_t block);  // ceil(n / block)
void encode_blocks(const float* x, int64_t n, int64_t block, BlockMap map, uint8_t* codes,
                   float* absmax);
void decode_blocks(const uint8_t* codes, const float* absmax, int64_t n, int64_t block,
                   BlockMap map, float* x);

}  // namespace optfuse::optim
