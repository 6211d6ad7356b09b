// The load stage's stack buffers forwarded to their readers (src/lower/load_stage.h), on small
// LLVM modules written the way Halide writes a kernel's: the main loop stores each loaded vector
// into the stage's buffer (and LLVM has moved the reads into registers already), the tail masks
// the store and reads the buffer back whole. The end-to-end check, that kernels still give their
// references' bits with ragged tails and in place, is every optimizer test's.
#include <gtest/gtest.h>
#include <llvm/AsmParser/Parser.h>
#include <llvm/IR/Instructions.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include <llvm/IR/Verifier.h>
#include <llvm/Support/SourceMgr.h>
#include <llvm/Support/raw_ostream.h>

#include <memory>
#include <string>

#include "lower/load_stage.h"

namespace optfuse {
namespace {

const char* kDeclarations = R"(
declare <4 x i32> @llvm.masked.load.v4i32.p0v4i32(<4 x i32>*, i32, <4 x i1>, <4 x i32>)
declare void @llvm.masked.store.v4i32.p0v4i32(<4 x i32>, <4 x i32>*, i32, <4 x i1>)
)";

// A kernel that copies `in` to `out`, staging each vector in BUFFER (and in %other, a buffer of
// another Func), with a masked tail vector whose read is `tail_read` ("" = none).
std::string kernel(const std::string& buffer, const std::string& tail_read) {
  return std::string(kDeclarations) + R"(
define void @k(<4 x i32>* %in, <4 x i32>* %out, i64 %n, <4 x i1> %mask) {
entry:
  %)" + buffer +
         R"( = alloca <4 x i32>, align 16
  %other = alloca <4 x i32>, align 16
  br label %loop
loop:
  %i = phi i64 [ 0, %entry ], [ %next, %loop ]
  %src = getelementptr <4 x i32>, <4 x i32>* %in, i64 %i
  %v = load <4 x i32>, <4 x i32>* %src
  %dst = getelementptr <4 x i32>, <4 x i32>* %out, i64 %i
  store <4 x i32> %v, <4 x i32>* %dst
  %next = add i64 %i, 1
  %done = icmp eq i64 %next, %n
  br i1 %done, label %exit, label %loop
exit:
  store <4 x i32> %v, <4 x i32>* %)" +
         buffer + R"(
  store <4 x i32> %v, <4 x i32>* %other
  %last = getelementptr <4 x i32>, <4 x i32>* %in, i64 %n
  %t = call <4 x i32> @llvm.masked.load.v4i32.p0v4i32(<4 x i32>* %last, i32 4, <4 x i1> %mask, <4 x i32> undef)
  call void @llvm.masked.store.v4i32.p0v4i32(<4 x i32> %t, <4 x i32>* %)" +
         buffer + R"(, i32 16, <4 x i1> %mask)
  call void @llvm.masked.store.v4i32.p0v4i32(<4 x i32> %t, <4 x i32>* %other, i32 16, <4 x i1> %mask)
  )" + tail_read +
         R"(
  %o = load <4 x i32>, <4 x i32>* %other
  %tail_dst = getelementptr <4 x i32>, <4 x i32>* %out, i64 %n
  call void @llvm.masked.store.v4i32.p0v4i32(<4 x i32> %o, <4 x i32>* %tail_dst, i32 4, <4 x i1> %mask)
  ret void
}
)";
}

struct Parsed {
  std::unique_ptr<llvm::LLVMContext> context = std::make_unique<llvm::LLVMContext>();
  std::unique_ptr<llvm::Module> module;
};

Parsed parse(const std::string& ir) {
  Parsed p;
  llvm::SMDiagnostic error;
  p.module = llvm::parseAssemblyString(ir, error, *p.context);
  if (!p.module) ADD_FAILURE() << "module did not parse: " << error.getMessage().str();
  return p;
}

std::string text(const llvm::Module& m) {
  std::string s;
  llvm::raw_string_ostream out(s);
  m.print(out, nullptr);
  return out.str();
}

bool has_buffer(const llvm::Module& m, const std::string& name) {
  for (const llvm::Instruction& i : m.getFunction("k")->getEntryBlock())
    if (llvm::isa<llvm::AllocaInst>(i) && i.getName() == name) return true;
  return false;
}

// The pass changes nothing in `ir`.
void expect_left_as_it_is(const std::string& ir) {
  Parsed p = parse(ir);
  ASSERT_TRUE(p.module);
  const std::string before = text(*p.module);
  lower::finish_load_stage_pass(*p.module);
  EXPECT_EQ(text(*p.module), before);
}

TEST(LoadStage, TailReadTakesTheMaskedLanesAndZerosAndTheBufferGoes) {
  for (const std::string buffer : {"load.08", "load$2.17"}) {
    Parsed p = parse(kernel(buffer, "%r = load <4 x i32>, <4 x i32>* %" + buffer + R"(
  %r_dst = getelementptr <4 x i32>, <4 x i32>* %out, i64 0
  store <4 x i32> %r, <4 x i32>* %r_dst)"));
    ASSERT_TRUE(p.module);
    lower::finish_load_stage_pass(*p.module);
    EXPECT_FALSE(llvm::verifyModule(*p.module, &llvm::errs()));
    const std::string after = text(*p.module);
    EXPECT_FALSE(has_buffer(*p.module, buffer)) << after;
    EXPECT_NE(after.find("select <4 x i1> %mask, <4 x i32> %t, <4 x i32> zeroinitializer"),
              std::string::npos)
        << after;
    // The main loop's value no longer leaves the loop for the buffer; %other's store stays.
    EXPECT_TRUE(has_buffer(*p.module, "other")) << after;
    EXPECT_NE(after.find("store <4 x i32> %v, <4 x i32>* %other"), std::string::npos) << after;
    EXPECT_EQ(after.find("store <4 x i32> %v, <4 x i32>* %\"" + buffer), std::string::npos);
    EXPECT_EQ(after.find("store <4 x i32> %v, <4 x i32>* %" + buffer + "\n"), std::string::npos);
  }
}

TEST(LoadStage, BufferWithoutReadsGoesWithItsWrites) {
  Parsed p = parse(kernel("load.08", ""));
  ASSERT_TRUE(p.module);
  lower::finish_load_stage_pass(*p.module);
  EXPECT_FALSE(llvm::verifyModule(*p.module, &llvm::errs()));
  EXPECT_FALSE(has_buffer(*p.module, "load.08")) << text(*p.module);
}

// Halide reads an f32 buffer of 16 lanes as two 8-lane halves (a bitcast, and a GEP to its
// middle): each half is a slot of its own, forwarded from its own write.
TEST(LoadStage, HalvesOfABufferAreForwardedEach) {
  const std::string ir = std::string(R"(
declare void @llvm.masked.store.v8f32.p0v8f32(<8 x float>, <8 x float>*, i32, <8 x i1>)

define <8 x float> @k(<8 x float> %a, <8 x float> %b, <8 x i1> %mask) {
entry:
  %load.35 = alloca [16 x float], align 32
  %low = bitcast [16 x float]* %load.35 to <8 x float>*
  %mid = getelementptr inbounds [16 x float], [16 x float]* %load.35, i64 0, i64 8
  %high = bitcast float* %mid to <8 x float>*
  store <8 x float> %a, <8 x float>* %low, align 32
  call void @llvm.masked.store.v8f32.p0v8f32(<8 x float> %b, <8 x float>* %high, i32 32, <8 x i1> %mask)
  %x = load <8 x float>, <8 x float>* %low, align 32
  %y = load <8 x float>, <8 x float>* %high, align 32
  %sum = fadd <8 x float> %x, %y
  ret <8 x float> %sum
}
)");
  Parsed p = parse(ir);
  ASSERT_TRUE(p.module);
  lower::finish_load_stage_pass(*p.module);
  EXPECT_FALSE(llvm::verifyModule(*p.module, &llvm::errs()));
  const std::string after = text(*p.module);
  EXPECT_FALSE(has_buffer(*p.module, "load.35")) << after;
  EXPECT_NE(after.find("select <8 x i1> %mask, <8 x float> %b, <8 x float> zeroinitializer"),
            std::string::npos)
      << after;
  EXPECT_NE(after.find("fadd <8 x float> %a, %"), std::string::npos) << after;
}

// A read that overlaps two writes (here all 16 lanes of a buffer written as halves) is not a
// slot's value: the buffer stays.
TEST(LoadStage, ReadAcrossSlotsKeepsTheBuffer) {
  const std::string ir = R"(
define <16 x float> @k(<8 x float> %a, <8 x float> %b) {
entry:
  %load.35 = alloca [16 x float], align 32
  %low = bitcast [16 x float]* %load.35 to <8 x float>*
  %mid = getelementptr inbounds [16 x float], [16 x float]* %load.35, i64 0, i64 8
  %high = bitcast float* %mid to <8 x float>*
  %whole = bitcast [16 x float]* %load.35 to <16 x float>*
  store <8 x float> %a, <8 x float>* %low, align 32
  store <8 x float> %b, <8 x float>* %high, align 32
  %x = load <16 x float>, <16 x float>* %whole, align 32
  ret <16 x float> %x
}
)";
  expect_left_as_it_is(ir);
}

// A read with no write before it in its block sees whatever an earlier block left: the buffer
// and all its writes stay.
TEST(LoadStage, ReadWithoutWriteInItsBlockKeepsTheBuffer) {
  std::string ir = kernel("load.08", "");
  const std::string loop_load = "%v = load <4 x i32>, <4 x i32>* %src\n";
  ir.replace(ir.find(loop_load), loop_load.size(),
             loop_load +
                 "  %stale = load <4 x i32>, <4 x i32>* %load.08\n"
                 "  store <4 x i32> %stale, <4 x i32>* %src\n");
  expect_left_as_it_is(ir);
}

// A buffer with any other use (here its address passed on) is left as it is.
TEST(LoadStage, BufferWithOtherUsesIsLeftAlone) {
  std::string ir = kernel("load.08", "");
  ir.replace(ir.find("  ret void"), 0, "  %escaped = ptrtoint <4 x i32>* %load.08 to i64\n");
  expect_left_as_it_is(ir);
}

}  // namespace
}  // namespace optfuse
