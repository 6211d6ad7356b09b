#include "lower/bf16.h"

#include <llvm/IR/Constants.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Instructions.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/IntrinsicsX86.h>
#include <llvm/IR/MDBuilder.h>
#include <llvm/IR/Module.h>
#include <llvm/Transforms/Utils/BasicBlockUtils.h>

#include <functional>
#include <string>
#include <vector>

#include "lower/even_odd.h"
#include "lower/float_widening.h"
#include "lower/lane_calls.h"

namespace optfuse::lower {
namespace {

using namespace Halide::Internal;
using Halide::Expr;

// Lanes the hardware narrowing takes: 32 times a power of two (hardware_bits concatenates
// halves of equal width).
bool whole_groups_of_32(unsigned lanes) {
  return lanes % 32 == 0 && ((lanes / 32) & (lanes / 32 - 1)) == 0;
}

// How a vector is narrowed (finish_bf16_pass builds the two call forms; every mode narrows
// scalars and vectors the mode does not take with the plain integer operations):
enum class Narrowing {
  Integer,       // the integer operations, lane by lane (CUDA, other architectures)
  NanBranch,     // x86 without AVX-512BW: vectors of 8 lanes or more test for NaNs once
  PackedHalves,  // x86 with AVX-512BW: rounded in the high halves, packed by one vpermt2w
  Hardware,      // and AVX512-BF16: vcvtne2ps2bf16 for whole groups of 32 lanes, else packed
};

class Bf16Conversions : public IRMutator {
  using IRMutator::visit;

  // Float widening intrinsics as casts, so that the conversions below see them.
  Expr visit(const Call* op) override {
    if (Expr casts = expand_float_widening(op); casts.defined()) return mutate(casts);
    return IRMutator::visit(op);
  }

  Expr visit(const Cast* op) override {
    Expr value = mutate(op->value);
    const Halide::Type to = op->type;
    const int lanes = to.lanes();
    const Halide::Type f32 = Halide::Float(32, lanes), u32 = Halide::UInt(32, lanes),
                       u16 = Halide::UInt(16, lanes);
    const bool from_bf16 = value.type().is_bfloat(), to_bf16 = to.is_bfloat();
    if (!from_bf16 && !to_bf16) return value.same_as(op->value) ? Expr(op) : Cast::make(to, value);
    if (from_bf16) {  // exact: the bf16 bits are the high half of the f32
      value = reinterpret(f32, cast(u32, reinterpret(u16, value)) << 16);
      if (!to_bf16) return to == f32 ? value : Cast::make(to, value);
    }
    if (value.type() != f32) value = Cast::make(f32, value);  // as Halide: other types via f32
    if (mode_ == Narrowing::Hardware && whole_groups_of_32(lanes))  // vcvtne2ps2bf16
      return reinterpret(to, Call::make(u16, kF32ToBf16, {value}, Call::PureExtern));
    if (mode_ == Narrowing::NanBranch && lanes >= 8)  // one NaN test per vector
      return reinterpret(to, Call::make(u16, kF32ToBf16NanBranch, {value}, Call::PureExtern));
    if (lanes == 1 || mode_ == Narrowing::Integer || mode_ == Narrowing::NanBranch)
      return reinterpret(to, bf16_bits_of(value));
    Expr bits = reinterpret(u32, value);
    Expr is_nan = (bits & 0x7fffffff) > 0x7f800000;
    // The same values, computed in the high halves of the 32-bit lanes and packed by ONE shuffle
    // of the 16-bit halves (vpermt2w) instead of a shift and a narrowing (vpsrld,
    // vpmovdw) per 16 lanes and an insert per 32; the rounding bias as a select on the lowest
    // kept bit (vptestmd and a masked add) instead of extracting it (vpsrld, vpandd, vpaddd).
    // The low halves are dropped: bits | 0x400000 has the quiet NaN's high half.
    Expr odd = (bits & 0x10000) != 0;
    Expr rounded = select(is_nan, bits | 0x400000, select(odd, bits + 0x8000, bits + 0x7fff));
    Expr halves = reinterpret(Halide::UInt(16, 2 * lanes), rounded);
    return reinterpret(to, Shuffle::make_slice(halves, 1, 2, lanes));
  }

 public:
  explicit Bf16Conversions(Narrowing mode) : mode_(mode) {}

 private:
  Narrowing mode_;
};

// The integer narrowing above, on an LLVM vector or scalar of f32, with the bf16 left in the
// high halves of i32 lanes: `bits` + 0x7fff + the lowest kept bit; a NaN's bits | 0x400000 (its
// quiet NaN; the carry could make it an infinity). `with_nans` false: for values known not to be
// NaNs, whose bits are rounded like any others'.
llvm::Value* rounded_bits(llvm::IRBuilder<>& b, llvm::Value* x, bool with_nans) {
  llvm::Type* i32 = b.getInt32Ty();
  auto* vt = llvm::dyn_cast<llvm::FixedVectorType>(x->getType());
  llvm::Type* t = vt ? llvm::FixedVectorType::get(i32, vt->getNumElements()) : i32;
  auto k = [&](uint32_t v) { return llvm::ConstantInt::get(t, v); };
  llvm::Value* bits = b.CreateBitCast(x, t);
  llvm::Value* lowest_kept = b.CreateAnd(b.CreateLShr(bits, k(16)), k(1));
  llvm::Value* rounded = b.CreateAdd(bits, b.CreateAdd(k(0x7fff), lowest_kept));
  if (!with_nans) return rounded;
  llvm::Value* is_nan = b.CreateICmpUGT(b.CreateAnd(bits, k(0x7fffffff)), k(0x7f800000));
  return b.CreateSelect(is_nan, b.CreateOr(bits, k(0x400000)), rounded);
}

// The same as u16 bits.
llvm::Value* narrow_bits(llvm::IRBuilder<>& b, llvm::Value* x, bool with_nans = true) {
  llvm::Value* rounded = rounded_bits(b, x, with_nans);
  llvm::Type* i16 = b.getInt16Ty();
  auto* vt = llvm::dyn_cast<llvm::FixedVectorType>(x->getType());
  return b.CreateTrunc(b.CreateLShr(rounded, llvm::ConstantInt::get(rounded->getType(), 16)),
                       vt ? llvm::FixedVectorType::get(i16, vt->getNumElements()) : i16);
}

std::vector<int> lanes(unsigned first, unsigned count) {
  std::vector<int> idx;
  for (unsigned i = 0; i < count; ++i) idx.push_back(static_cast<int>(first + i));
  return idx;
}

// `rare(slow)` if `condition`, else `usual(fast)`, at b's insertion point, which then moves to
// where the two paths join; returns the value they give.
llvm::Value* branch_rarely(llvm::IRBuilder<>& b, llvm::Module& m, llvm::Value* condition,
                           const std::function<llvm::Value*(llvm::IRBuilder<>&)>& rare,
                           const std::function<llvm::Value*(llvm::IRBuilder<>&)>& usual) {
  llvm::Instruction* slow_end = nullptr;
  llvm::Instruction* fast_end = nullptr;
  llvm::MDNode* rarely = llvm::MDBuilder(m.getContext()).createBranchWeights(1, 1 << 20);
  llvm::SplitBlockAndInsertIfThenElse(condition, &*b.GetInsertPoint(), &slow_end, &fast_end,
                                      rarely);
  llvm::IRBuilder<> slow(slow_end), fast(fast_end);
  llvm::Value* exact = rare(slow);
  llvm::Value* quick = usual(fast);
  b.SetInsertPoint(&*fast_end->getSuccessor(0)->getFirstInsertionPt());
  llvm::PHINode* joined = b.CreatePHI(exact->getType(), 2);
  joined->addIncoming(exact, slow_end->getParent());
  joined->addIncoming(quick, fast_end->getParent());
  return joined;
}

// Whether a lane of the f32 vector `x` is a NaN: the compare of its halves with each other,
// "unordered" (one vcmpunordps per two AVX2 vectors), then their or.
llvm::Value* any_nan(llvm::IRBuilder<>& b, llvm::Value* x) {
  const unsigned n = llvm::cast<llvm::FixedVectorType>(x->getType())->getNumElements();
  return b.CreateOrReduce(n % 2 == 0 && n >= 16
                              ? b.CreateFCmpUNO(b.CreateShuffleVector(x, lanes(0, n / 2)),
                                                b.CreateShuffleVector(x, lanes(n / 2, n / 2)))
                              : b.CreateFCmpUNO(x, x));
}

// The narrowing of an f32 vector with ONE test for NaNs (any_nan), and only where it finds one
// the NaN lanes' selects.
llvm::Value* nan_branch(llvm::IRBuilder<>& b, llvm::Module& m, llvm::Value* x) {
  if (!x->getType()->isVectorTy()) return narrow_bits(b, x, true);
  return branch_rarely(
      b, m, any_nan(b, x), [&](llvm::IRBuilder<>& slow) { return narrow_bits(slow, x, true); },
      [&](llvm::IRBuilder<>& fast) { return narrow_bits(fast, x, false); });
}

// Word j of the bf16 of `even` lane j (low half) and `odd` lane j (high half), each narrowed by
// the integer operations above.
llvm::Value* pair_bits(llvm::IRBuilder<>& b, llvm::Value* even, llvm::Value* odd, bool with_nans) {
  llvm::Value* e = rounded_bits(b, even, with_nans);
  llvm::Value* o = rounded_bits(b, odd, with_nans);
  auto k = [&](uint32_t v) { return llvm::ConstantInt::get(e->getType(), v); };
  return b.CreateOr(b.CreateAnd(o, k(0xffff0000)), b.CreateLShr(e, k(16)));
}

// The same words for vectors without NaNs, rounded in 16-bit lanes, each instruction on as many
// values as it has 16-bit lanes: `high` is the words the store takes, unrounded (odd's high half
// and even's, shifted down, blended: vpblendw), `low` their low halves alike, and each 16-bit
// lane of `high` goes up by one where nearest even says so. That is where low > 0x8000, or
// low == 0x8000 and high is odd: where low + (high & 1) - 1 >= 0x8000. With w = low - (1 -
// (high & 1)), saturating at 0 (vpandn, vpsubusw), that is w's sign bit (vpcmpgtw against zero),
// the carry subtracted as the compare's all-ones: 8 instructions per 16 values where rounding
// each half and packing them took 11 (src/lower/bf16.md, "bf16 pairs in 16-bit lanes"). No carry
// leaves a lane: 0xffff and 0x7fff are NaNs.
llvm::Value* pair_bits_in_halves(llvm::IRBuilder<>& b, llvm::Value* even, llvm::Value* odd) {
  const unsigned n = llvm::cast<llvm::FixedVectorType>(even->getType())->getNumElements();
  llvm::Type* words = llvm::FixedVectorType::get(b.getInt32Ty(), n);
  llvm::Type* halves = llvm::FixedVectorType::get(b.getInt16Ty(), 2 * n);
  auto k32 = [&](uint32_t v) { return llvm::ConstantInt::get(words, v); };
  auto k16 = [&](uint16_t v) { return llvm::ConstantInt::get(halves, v); };
  llvm::Value* e = b.CreateBitCast(even, words);
  llvm::Value* o = b.CreateBitCast(odd, words);
  std::vector<int> blend;  // even 16-bit lanes from the first operand, odd ones from the second
  for (unsigned i = 0; i < 2 * n; ++i) blend.push_back(static_cast<int>(i % 2 ? 2 * n + i : i));
  auto blended = [&](llvm::Value* low_from, llvm::Value* high_from) {
    return b.CreateShuffleVector(b.CreateBitCast(low_from, halves),
                                 b.CreateBitCast(high_from, halves), blend);
  };
  llvm::Value* high = blended(b.CreateLShr(e, k32(16)), o);
  llvm::Value* low = blended(e, b.CreateShl(o, k32(16)));
  llvm::Value* not_lsb = b.CreateAnd(b.CreateXor(high, k16(0xffff)), k16(1));
  llvm::Value* w =  // (LLVM's form of an unsigned saturating subtract)
      b.CreateSelect(b.CreateICmpUGT(low, not_lsb), b.CreateSub(low, not_lsb), k16(0));
  llvm::Value* carry = b.CreateICmpSLT(w, k16(0));
  return b.CreateBitCast(b.CreateSub(high, b.CreateSExt(carry, halves)), words);
}

// pair_bits with ONE test for NaNs per pair of vectors (the compare of the two, "unordered"),
// the NaN lanes' selects only where one is.
llvm::Value* pair_nan_branch(llvm::IRBuilder<>& b, llvm::Module& m, llvm::Value* even,
                             llvm::Value* odd) {
  if (!even->getType()->isVectorTy()) return pair_bits(b, even, odd, true);
  return branch_rarely(
      b, m, b.CreateOrReduce(b.CreateFCmpUNO(even, odd)),
      [&](llvm::IRBuilder<>& slow) { return pair_bits(slow, even, odd, true); },
      [&](llvm::IRBuilder<>& fast) { return pair_bits_in_halves(fast, even, odd); });
}

// vcvtne2ps2bf16 of each 32 lanes of `x` (a multiple of 32 f32 lanes), concatenated.
llvm::Value* hardware_bits(llvm::IRBuilder<>& b, llvm::Module& m, llvm::Value* x, unsigned n) {
  llvm::Function* cvt =
      llvm::Intrinsic::getDeclaration(&m, llvm::Intrinsic::x86_avx512bf16_cvtne2ps2bf16_512);
  std::vector<llvm::Value*> parts;
  for (unsigned first = 0; first < n; first += 32)  // the low 16 results from the 2nd operand
    parts.push_back(b.CreateCall(cvt, {b.CreateShuffleVector(x, lanes(first + 16, 16)),
                                       b.CreateShuffleVector(x, lanes(first, 16))}));
  for (unsigned width = 32; parts.size() > 1; width *= 2) {  // 32 + 32 lanes, 64 + 64, ...
    std::vector<llvm::Value*> next;
    for (size_t i = 0; i + 1 < parts.size(); i += 2)
      next.push_back(b.CreateShuffleVector(parts[i], parts[i + 1], lanes(0, 2 * width)));
    if (parts.size() % 2) next.push_back(parts.back());
    parts = next;
  }
  return parts[0];
}

// Whether any lane of `x` (a multiple of 16 f32 lanes) is subnormal: one vfpclassps per 16 lanes
// (class bit 5, "denormal"), the masks or-ed, one kortest. The integer test (clear the sign,
// subtract 1, compare below 0x7fffff) takes 4 vector instructions per 16 lanes, in loops whose
// vector ports are their limit (src/lower/README.md).
llvm::Value* any_subnormal(llvm::IRBuilder<>& b, llvm::Module& m, llvm::Value* x, unsigned n) {
  llvm::Function* fpclass =
      llvm::Intrinsic::getDeclaration(&m, llvm::Intrinsic::x86_avx512_fpclass_ps_512);
  llvm::Value* any = nullptr;
  for (unsigned first = 0; first < n; first += 16) {
    llvm::Value* sub =
        b.CreateCall(fpclass, {b.CreateShuffleVector(x, lanes(first, 16)), b.getInt32(0x20)});
    any = any ? b.CreateOr(any, sub) : sub;
  }
  return b.CreateOrReduce(any);
}

}  // namespace

Expr bf16_bits_of(const Expr& f32) {
  const int lanes = f32.type().lanes();
  Expr bits = reinterpret(Halide::UInt(32, lanes), f32);
  Expr is_nan = (bits & 0x7fffffff) > 0x7f800000;
  Expr nearest_even = (bits + (0x7fff + ((bits >> 16) & 1))) >> 16;
  Expr quiet_nan = (bits >> 16) | 0x40;  // a NaN plus the carry could become an infinity
  return cast(Halide::UInt(16, lanes), select(is_nan, quiet_nan, nearest_even));
}

void finish_bf16_pass(llvm::Module& m) {
  replace_unary_lane_calls(m, kF32ToBf16NanBranch, [&](llvm::IRBuilder<>& b, llvm::Value* x) {
    return nan_branch(b, m, x);
  });
  replace_lane_calls(m, kF32PairToBf16NanBranch,
                     [&](llvm::IRBuilder<>& b, const std::vector<llvm::Value*>& args) {
                       return pair_nan_branch(b, m, args[0], args[1]);
                     });
  replace_lane_calls(
      m, kF32PairToBf16, [&](llvm::IRBuilder<>& b, const std::vector<llvm::Value*>& args) {
        return args[0]->getType()->isVectorTy() ? pair_bits_in_halves(b, args[0], args[1])
                                                : pair_bits(b, args[0], args[1], true);
      });
  replace_lane_calls(m, kUnordered,
                     [&](llvm::IRBuilder<>& b, const std::vector<llvm::Value*>& args) {
                       return b.CreateFCmpUNO(args[0], args[1]);
                     });
  bool changed = false;
  replace_unary_lane_calls(
      m, kF32ToBf16, [&](llvm::IRBuilder<>& b, llvm::Value* x) -> llvm::Value* {
        auto* vt = llvm::dyn_cast<llvm::FixedVectorType>(x->getType());
        const unsigned n = vt ? vt->getNumElements() : 1;
        if (!whole_groups_of_32(n)) return narrow_bits(b, x);
        changed = true;
        return branch_rarely(  // a subnormal lane: the integer path
            b, m, any_subnormal(b, m, x, n),
            [&](llvm::IRBuilder<>& slow) { return narrow_bits(slow, x); },
            [&](llvm::IRBuilder<>& fast) { return hardware_bits(fast, m, x, n); });
      });
  // The code generator takes its features from the module (Halide's "halide_mattrs" flag): the
  // extensions the fast path uses (vcvtne2ps2bf16; vfpclassps, which every CPU with the former
  // has) are added there when Halide did not list them.
  if (!changed) return;
  auto* flag = llvm::dyn_cast_or_null<llvm::MDString>(m.getModuleFlag("halide_mattrs"));
  std::string mattrs = flag ? flag->getString().str() : "";
  for (const char* feature : {"+avx512bf16", "+avx512dq"})
    if (mattrs.find(feature) == std::string::npos)
      mattrs += (mattrs.empty() ? "" : ",") + std::string(feature);
  m.setModuleFlag(llvm::Module::Warning, "halide_mattrs",
                  llvm::MDString::get(m.getContext(), mattrs));
}

void add_bf16_pass(Halide::Pipeline& p, const Halide::Target& target, bool avx512_bf16) {
  // Every target: on CUDA it is also what makes bf16 stores compile at all. The packing shuffle
  // only on x86 CPUs with AVX-512BW (vpermt2w): on AVX2 LLVM builds it from several shuffles,
  // and the 4-read-3-write bf16 ceiling kernel took twice as long as with vpsrld / vpmovdw-style
  // narrowing (2^14 elements, in cache).
  using T = Halide::Target;
  const bool avx512bw = target.has_feature(T::AVX512_Skylake) ||
                        target.has_feature(T::AVX512_Cannonlake) ||
                        target.has_feature(T::AVX512_SapphireRapids);
  const bool x86_cpu = target.arch == T::X86 && !target.has_gpu_feature();
  const Narrowing mode = !x86_cpu      ? Narrowing::Integer
                         : !avx512bw   ? Narrowing::NanBranch
                         : avx512_bf16 ? Narrowing::Hardware
                                       : Narrowing::PackedHalves;
  // Without AVX512-BF16, all-bf16 loops first run in even/odd lane order (even_odd.h): it takes
  // the widening's zero-extensions and shifts and the narrowing's packs out of them (AVX2 and
  // AVX-512 alike; src/lower/bf16.md, "bf16 in even/odd lane order", has the measurements).
  if (mode == Narrowing::NanBranch || mode == Narrowing::PackedHalves)
    p.add_custom_lowering_pass(new EvenOddLanes());
  p.add_custom_lowering_pass(new Bf16Conversions(mode));
}

}  // namespace optfuse::lower
