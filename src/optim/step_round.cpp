#include "optim/step_round.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>

#include "optfuse/error.h"
#include "optim/precision.h"
#include "optim/sparse_grad.h"

namespace optfuse::optim {
namespace {

using Impl = OptimizerState;

// Elements per slice of a large tensor whose schedule fixes no task size: at least this many,
// large enough that the start of a slice (before its prefetches run ahead) costs about 1%, small
// enough that the round's last slices still balance the threads; and at most kSlicesPerThread
// slices per worker thread of one tensor. Every slice start costs streaming bandwidth: at 2^24
// elements, slices of n / 8 instead of 2^17 made AdamW's step 2-3% faster with f32 state and
// 8-bit state alike, and GPT-2 small's whole step 2-5% (bench_block_state's
// BlockState/adamw/step, bench_models' Model/adamw/f32/gpt2-small, 2 threads).
constexpr int64_t kSliceElems = int64_t(1) << 17;
constexpr int64_t kSlicesPerThread = 4;
// A thread claims consecutive slices of at least this many elements at a time: one atomic
// increment per claim, not per 1K-element tensor.
constexpr int64_t kClaimElems = 16384;

void* input_pointer(const Impl::Tensor& t, const KernelSignature::TensorArg& arg, size_t i) {
  switch (arg.role) {
    case Role::Param:
      return t.ref.param.data;
    case Role::Grad:
      return t.ref.grad.data;
    case Role::State:
    case Role::RowState:
    case Role::ColState:
      return t.inputs[i];
  }
  internal_error("bad role");
}

// This step's scalars for `t`, in signature order; advances t's step and host state. Tensors of
// a group nearly always share their step and host state, so the values are computed once and
// reused while those are equal (the group's memo).
const std::vector<double>& step_scalars(const Impl& impl, Impl::Group& g, Impl::Tensor& t,
                                        bool created_now) {
  Impl::Group::ScalarMemo& memo = g.memo;
  if (!t.bound_scalars.empty()) load_bound_scalars(t);
  int64_t step = ++t.step;
  const int64_t cols = t.row_cols();
  const int64_t rows = t.ref.param.numel / cols;
  const bool by_shape = impl.rule->scalars_read_shape();
  if (memo.valid && memo.step == step && memo.created_now == created_now &&
      memo.host_before == t.host && (!by_shape || (memo.rows == rows && memo.cols == cols))) {
    t.host = memo.host_after;
    if (!t.bound_scalars.empty()) store_bound_scalars(t);
    return g.factored(t) ? memo.factored_values : memo.values;
  }
  memo.valid = false;
  memo.host_before = t.host;
  std::map<std::string, double> values;
  impl.rule->scalars(
      g.options,
      TensorStep{step, created_now, &t.host, rows, cols, g.plan()->recipe.precision.param},
      &values);
  values[kGradScale] = impl.control.grad_scale;  // used when the kernel has the prologue
  values[kRoundingKey] = 0;                      // per tensor: prepare_call sets it
  // (The group's 8-bit kernel takes the same scalars: plan_group checks.)
  auto in_order = [&](const KernelPlan& kp, std::vector<double>* out) {
    out->clear();
    if (!kp.planned) return;
    for (const auto& s : kp.signature.scalars) {
      auto it = values.find(s.name);
      if (it == values.end()) internal_error("rule gave no value for scalar '" + s.name + "'");
      out->push_back(it->second);
    }
  };
  in_order(g.plan()->dense, &memo.values);
  in_order(g.plan()->factored, &memo.factored_values);
  memo.step = step;
  memo.rows = rows;
  memo.cols = cols;
  memo.created_now = created_now;
  memo.host_after = t.host;
  memo.valid = true;
  if (!t.bound_scalars.empty()) store_bound_scalars(t);
  return g.factored(t) ? memo.factored_values : memo.values;
}

// `t`'s whole call for this step in `call` (reusing its vectors: no allocation once warm). For
// a tensor with 8-bit state it covers the whole blocks; tail_call() gives the rest.
void prepare_call(const Impl& impl, Impl::Group& g, Impl::Tensor& t, const Kernel& kernel,
                  bool created_now, KernelCall& call) {
  const KernelPlan& kp = g.plan_of(t);
  call.scalars = step_scalars(impl, g, t, created_now);
  if (kp.key_slot >= 0)
    call.scalars[static_cast<size_t>(kp.key_slot)] =
        rounding_key(g.options.at("rounding_seed").get<uint64_t>(), t.step, t.stream);
  call.n = t.ref.param.numel;
  if (t.bound != g.binding) internal_error("a tensor's state is not bound to its group's kernel");
  const KernelSignature& sig = kp.signature;
  call.inputs.resize(sig.inputs.size());
  for (size_t i = 0; i < sig.inputs.size(); ++i)
    call.inputs[i] = input_pointer(t, sig.inputs[i], i);
  call.outputs.resize(kp.output_input.size());
  for (size_t i = 0; i < kp.output_input.size(); ++i)
    call.outputs[i] = call.inputs[kp.output_input[i]];
  // Only a per-row kernel reads cols: a gradient-centralized graph (only on >= 2 dims, where
  // its rows are row_cols()), a custom graph with row_* ops, or 8-bit state (rows are blocks);
  // a per-column (factored) one also batch_rows: the matrices of its last two dims.
  const KernelSignature& ks = kernel.signature();
  call.cols = ks.per_col ? t.matrix_cols() : ks.per_row ? t.row_cols() : 0;
  call.batch_rows = ks.per_col ? t.matrix_rows() : 0;
  if (const int64_t block = g.block_of(t)) {
    call.cols = block;
    call.n -= call.n % call.cols;
  }
  call.device = impl.memory == Memory::Cuda;
  call.cuda_stream = impl.cuda_stream;
  call.serial = false;
}

// `lane` = `whole` moved to element `begin` for `n` elements: element tensors by `begin`
// elements, row state by begin / cols rows (`begin` starts a row).
void slice_call(const KernelSignature& sig, const KernelCall& whole, int64_t begin, int64_t n,
                KernelCall& lane) {
  const int64_t row = whole.cols > 0 ? begin / whole.cols : 0;
  auto at = [&](void* p, DType t, bool rows) {
    return static_cast<void*>(static_cast<char*>(p) +
                              (rows ? row : begin) * static_cast<int64_t>(dtype_size(t)));
  };
  lane.scalars = whole.scalars;
  lane.inputs.resize(whole.inputs.size());
  for (size_t i = 0; i < lane.inputs.size(); ++i)
    lane.inputs[i] = at(whole.inputs[i], sig.inputs[i].dtype, sig.inputs[i].role == Role::RowState);
  lane.outputs.resize(whole.outputs.size());
  for (size_t i = 0; i < lane.outputs.size(); ++i)
    lane.outputs[i] = at(whole.outputs[i], sig.outputs[i].dtype, sig.outputs[i].row_state);
  lane.n = n;
  lane.cols = whole.cols;
  lane.batch_rows = whole.batch_rows;
  lane.device = whole.device;
  lane.cuda_stream = whole.cuda_stream;
  lane.serial = false;
}

// The last, shorter block of a tensor with 8-bit state, as a call of its own (one row of `tail`
// elements) after `whole`'s blocks; false if its blocks cover it. With stochastic rounding it
// draws from another stream than the tensor's first elements, which start at index 0 too.
bool tail_call(const Impl::Group& g, const Impl::Tensor& t, const KernelCall& whole,
               KernelCall& tail) {
  const int64_t rest = t.ref.param.numel - whole.n;
  if (g.block_of(t) == 0 || rest == 0) return false;
  const KernelPlan& kp = g.plan_of(t);
  slice_call(kp.signature, whole, whole.n, rest, tail);
  tail.cols = rest;
  if (kp.key_slot >= 0)
    tail.scalars[static_cast<size_t>(kp.key_slot)] =
        rounding_key(g.options.at("rounding_seed").get<uint64_t>(), t.step, ~t.stream);
  return true;
}

// Whether `t`'s call may run as slices in the round: host memory, a dense gradient, and a
// kernel whose elements do not depend on where the call starts (no whole-tensor or column
// reduction, no opaque op that needs the whole matrix, no stochastic rounding, which draws its
// bits by element index).
bool sliceable(const Impl& impl, const Impl::Group& g, const Impl::Tensor& t,
               const Kernel& kernel) {
  const KernelSignature& sig = kernel.signature();
  return impl.memory == Memory::Host && !t.sparse.set && g.plan_of(t).key_slot < 0 &&
         !sig.reduces && !sig.per_col && !sig.whole;
}

// Appends the slices of round.calls[call]: one for a call that fits a single task, else
// near-equal slices of whole vectors (whole rows for a per-row kernel), each run serially with
// prefetches (KernelCall::serial). None for an empty call.
void add_slices(StepRunner& round, uint32_t call, const Schedule& s, int threads) {
  const KernelCall& whole = round.calls[call].call;
  const int64_t n = whole.n, cols = whole.cols;
  if (n == 0) return;
  if (n <= s.min_task) {
    round.slices.push_back({call, 0, n, false});
    return;
  }
  const int64_t unit =
      cols > 0 ? cols : int64_t(std::max(s.vector_width, 1)) * std::max(s.unroll, 1);
  const int64_t most = kSlicesPerThread * std::max(threads, 1);
  const int64_t fewest = (n + most - 1) / most;
  const int64_t target =
      std::max(s.task_elems > 0 ? s.task_elems : std::max(kSliceElems, fewest), s.min_task);
  const int64_t count = std::max<int64_t>(1, (n + target - 1) / target);
  int64_t per = (n + count - 1) / count;
  per = (per + unit - 1) / unit * unit;
  for (int64_t begin = 0; begin < n; begin += per)
    round.slices.push_back({call, begin, std::min(per, n - begin), true});
}

// Runs one slice with `lane` as the call: the tensor's call with every pointer moved to the
// slice's first element.
void run_slice(const StepRunner& round, const StepRunner::Slice& slice, KernelCall& lane) {
  const StepRunner::Call& c = round.calls[slice.call];
  slice_call(c.kernel->signature(), c.call, slice.begin, slice.n, lane);
  lane.serial = slice.serial;
  c.kernel->run(lane);
}

}  // namespace

// Tensors on the device launch in order from the caller, on the step's stream (a launch is
// asynchronous: more threads would not help). On the host, every tensor's call is cut into
// slices and ALL slices of the step, of every group, run in one round of the worker pool: a
// thread claims the next few slices until none are left. Per-tensor parallel calls instead each
// woke the threads and waited for the slowest at the end (a barrier per tensor), and a round
// per group made 100 groups of 10 small tensors 20 times slower than one group of 1000. Calls
// that cannot be sliced (sparse gradients, whole-tensor reductions, stochastic rounding) and are
// larger than one task run first, each parallel inside its kernel. Tensors are independent, so
// the order changes no result.
void run_groups(Impl& impl, StepRunner& round, const std::vector<const Impl::Tensor*>& created) {
  const bool device = impl.memory == Memory::Cuda;
  const int threads = device ? 1 : impl.engine->num_threads();
  auto created_now = [&](const Impl::Tensor& t) {
    return std::binary_search(created.begin(), created.end(), &t);
  };
  round.lanes.resize(static_cast<size_t>(std::max(threads, 1)));
  round.slices.clear();
  size_t calls = 0;
  auto next_call = [&]() -> StepRunner::Call& {
    if (round.calls.size() <= calls) round.calls.resize(calls + 1);
    return round.calls[calls];
  };
  for (auto& g : impl.groups) {
    g.memo.valid = false;
    const std::vector<std::shared_ptr<const Kernel>>& kernels = g.kernels();
    for (size_t ti = 0; ti < g.tensors.size(); ++ti) {
      Impl::Tensor& t = g.tensors[ti];
      const Kernel& kernel = *kernels[ti];
      const bool small = t.ref.param.numel <= kernel.schedule().min_task;
      if (device || t.sparse.set || (!small && !sliceable(impl, g, t, kernel))) {
        KernelCall& call = round.lanes[0];
        prepare_call(impl, g, t, kernel, created_now(t), call);
        if (t.sparse.set) {  // only the touched rows, one call per run of consecutive rows
          const std::vector<void*> base = call.inputs;
          run_sparse(kernel, g.plan_of(t).output_input, call, base, t.sparse);
          continue;
        }
        if (call.n > 0) kernel.run(call);
        if (KernelCall tail; tail_call(g, t, call, tail)) kernel.run(tail);
        continue;
      }
      StepRunner::Call& c = next_call();
      c.kernel = &kernel;
      prepare_call(impl, g, t, kernel, created_now(t), c.call);
      add_slices(round, static_cast<uint32_t>(calls), kernel.schedule(), threads);
      ++calls;
      StepRunner::Call& tail = next_call();
      if (tail_call(g, t, round.calls[calls - 1].call, tail.call)) {
        tail.kernel = &kernel;
        round.slices.push_back({static_cast<uint32_t>(calls), 0, tail.call.n, false});
        ++calls;
      }
    }
  }
  // Claims: runs of consecutive slices of at least kClaimElems elements.
  make_claims(
      round.slices.size(), [&](size_t i) { return round.slices[i].n; }, kClaimElems, &round.claims);
  WorkerPool* pool = !device && round.claims.size() > 2 ? round_pool(impl, round) : nullptr;
  run_claims(pool, round.claims, [&](int k, size_t i) {
    run_slice(round, round.slices[i], round.lanes[static_cast<size_t>(k)]);
  });
}

WorkerPool* round_pool(const Impl& impl, StepRunner& runner) {
  const int threads = impl.engine->num_threads();
  if (threads < 2) return nullptr;
  if (!runner.pool || runner.pool->threads() != threads)
    runner.pool = std::make_unique<WorkerPool>(threads);
  return runner.pool.get();
}

}  // namespace optfuse::optim
