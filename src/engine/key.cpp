#include "engine/key.h"

#include <vector>

#include "jit/halide_bridge.h"

#ifndef OPTFUSE_VERSION
#error "OPTFUSE_VERSION must be defined by the build (CMakeLists.txt)"
#endif

namespace optfuse {

std::string Schedule::str() const {
  if (gpu_block > 0)
    return "gpu.v" + std::to_string(vector_width) + ".b" + std::to_string(gpu_block);
  std::string s = "v" + std::to_string(vector_width) + ".t" + std::to_string(tasks_per_thread) +
                  ".m" + std::to_string(min_task);
  if (unroll > 1) s += ".u" + std::to_string(unroll);
  if (task_elems > 0) s += ".c" + std::to_string(task_elems);
  if (prefetch != Schedule{}.prefetch) s += ".p" + std::to_string(prefetch);
  if (prefetch_l2 != Schedule{}.prefetch_l2) s += ".l" + std::to_string(prefetch_l2);
  return s;
}

namespace {

template <typename Args>
int index_of(const Args& args, const std::string& name, std::string Args::value_type::*field) {
  for (size_t i = 0; i < args.size(); ++i)
    if (args[i].*field == name) return static_cast<int>(i);
  return -1;
}

// Fields joined with a separator no field contains (a newline), so ("ab","c") != ("a","bc").
std::string joined(const std::vector<std::string>& fields) {
  std::string s;
  for (const std::string& f : fields) s += f + "\n";
  return s;
}

}  // namespace

int KernelSignature::input_index(const std::string& name) const {
  return index_of(inputs, name, &TensorArg::name);
}

int KernelSignature::scalar_index(const std::string& name) const {
  return index_of(scalars, name, &ScalarArg::name);
}

int KernelSignature::result_index(const std::string& name) const {
  return index_of(results, name, &ResultArg::name);
}

std::string signature_text(const KernelSignature& s) {
  std::string t;
  for (const auto& in : s.inputs)
    t += "in " + in.name + " " + std::string(role_name(in.role)) + " " +
         std::string(dtype_name(in.dtype)) + "\n";
  for (const auto& sc : s.scalars)
    t += "scalar " + sc.name + " " + std::string(dtype_name(sc.dtype)) + "\n";
  for (const auto& out : s.outputs)
    t += "out " + out.replaces + " " + std::string(dtype_name(out.dtype)) + "\n";
  // Only graphs with results or row reductions add lines: older texts stay valid.
  for (const auto& r : s.results)
    t += "result " + r.name + " " + std::string(dtype_name(r.dtype)) + "\n";
  if (s.per_row) t += "per_row\n";
  if (s.reduces) t += "reduces\n";
  if (s.whole) t += "whole\n";
  return t;
}

namespace engine_detail {

// Bumped whenever lowering or a schedule generates different code for the same graph and
// Schedule (a changed op lowering, a new specialization), so that cached objects of the old code
// are misses instead of being reused. 2: single-task calls bypass the thread pool. 3: software
// prefetch in the parallel tasks' loop (Schedule::prefetch). 4: f16 conversions as F16C
// instructions on x86 (lower/f16c.h). 5: a second prefetch into L2, farther ahead
// (Schedule::prefetch_l2). 6: outputs no input load reads (16-bit params) prefetched too.
// 7: bf16 conversions as integer operations on CPU targets (lower/bf16.h). 8: the streaming
// single-task loop of flat CPU kernels (chunk < 0, KernelCall::serial): an object without it
// would run a serial call as one-vector parallel tasks. 9: f32 multiply-adds written through f64
// as one FMA and f32 square roots as whole-vector ones on x86 (lower/fma.h); bf16 narrowing
// packed by one shuffle on AVX-512BW (lower/bf16.h). 10: maxima and minima reduced in f32 (not
// f64) and a row's whole vectors read without bounds (lower/reduce.h); row state. 11: f16
// conversions whose lanes LLVM split or scalarized, and Halide's widening_add / _sub / _mul of
// 16-bit floats, as whole-vector F16C instructions too (lower/f16c.h, lower/lane_calls.h); bf16
// narrowing of split or scalarized lanes packed too (lower/bf16.h). (Its AVX512-BF16 form is a
// key part of its own: jit::cpu_extras_key.) 12: bf16 narrowing's subnormal test by vfpclassps.
// 13: selects on a bool scalar compiled as a loop per value (lower/schedule.h, `cases`); uniform
// f32 -> f64 widenings in the element loop, so that they reach the FMA (lower/fma.h). 14: CPU
// kernels without Halide's assertions and bounds queries (jit/halide_bridge.cpp, kernel_target);
// a flat call that fits one task runs the streaming loop (lower/schedule.cpp), not one of its own.
// 15: the load stage's stack buffers forwarded to their readers (lower/load_stage.h); bf16
// narrowing on x86 without AVX-512BW with one NaN test per vector (lower/bf16.h). 16: all-bf16
// loops on x86 without AVX-512BW in even/odd lane order (lower/even_odd.h). 17: and on AVX-512
// without AVX512-BF16. 18: their stores on x86 without AVX-512BW rounded in 16-bit lanes, even
// and odd halves together (lower/bf16.h, kF32PairToBf16NanBranch). 19: their carry in four
// instructions. 20: and on AVX-512 without AVX512-BF16, with one NaN test per loop body there too.
constexpr const char* kLoweringVersion = "lowering-20";

std::string kernel_key(const Hash128& graph_hash, const Schedule& resolved,
                       const std::string& target) {
  std::vector<std::string> parts = {
      "kernel",        graph_hash.hex(), resolved.str(),          target,
      OPTFUSE_VERSION, kLoweringVersion, jit::toolchain_version()};
  // Only kernels that use more of the CPU than the target says add a part: other keys stay.
  if (std::string extras = jit::cpu_extras_key(target); !extras.empty()) parts.push_back(extras);
  return xxh3_128(joined(parts)).hex();
}

std::string runtime_key(const std::string& target) {
  return xxh3_128(joined({"halide-runtime", target, OPTFUSE_VERSION, jit::toolchain_version()}))
      .hex();
}

}  // namespace engine_detail
}  // namespace optfuse
