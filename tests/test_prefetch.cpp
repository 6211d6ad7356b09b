// Software prefetch in CPU kernels (src/lower/prefetch.*, Schedule::prefetch and prefetch_l2):
// where the lowered code prefetches (every input, every cache line of each vector, `prefetch`
// bytes ahead and again into L2 `prefetch_l2` bytes ahead, in the parallel tasks' loop, the
// streaming one-task loop and the row loop of per-row kernels, nowhere else), that a distance of
// 0 removes its kind, that the prefetches are
// t0 and t1 (not the nta Halide emits), and that prefetching never changes a result bit.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <regex>
#include <set>
#include <string>

#include "jit/halide_bridge.h"
#include "optfuse/optfuse.hpp"
#include "support/engine.h"
#include "support/gen.h"
#include "support/objdump.h"
#include "support/run_kernel.h"

namespace optfuse {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

const char* kTarget = "x86-64-linux-avx2-fma";  // 8 f32 lanes: the default vector is 16 lanes

Schedule with_prefetch(int bytes, int l2_bytes = Schedule{}.prefetch_l2) {
  Schedule s;
  s.prefetch = bytes;
  s.prefetch_l2 = l2_bytes;
  return jit::resolve_schedule(s, kTarget);
}

std::string stmt(const Graph& g, int prefetch_bytes, int l2_bytes = Schedule{}.prefetch_l2) {
  return jit::lowered_stmt(canonicalize(g), with_prefetch(prefetch_bytes, l2_bytes), kTarget);
}

enum class Level { Near, L2 };

// The buffers named by the prefetch calls of a lowered statement, one per call:
// "(float32)prefetch(in1_grad, <offset>, 1, 1)"; an L2 prefetch's offset adds the marker
// "optfuse_prefetch_l2_marker()" (src/lower/prefetch.h).
std::multiset<std::string> prefetched_buffers(const std::string& text, Level level = Level::Near) {
  std::multiset<std::string> names;
  std::regex call(R"(\bprefetch\(([A-Za-z0-9_$.]+), ([^\n]*), 1, 1\))");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), call); it != std::sregex_iterator();
       ++it) {
    const bool l2 = (*it)[2].str().find("optfuse_prefetch_l2_marker()") != std::string::npos;
    if (l2 == (level == Level::L2)) names.insert((*it)[1]);
  }
  return names;
}

// The loop named `var` ("for (out.s0.x.<var>, ..." up to the next loop; the Func may be named
// out$N), or "" with a test failure if there is none.
std::string loop(const std::string& text, const std::string& var) {
  size_t at = text.find(".s0.x." + var + ", ");
  if (at == std::string::npos) {
    ADD_FAILURE() << "no loop " << var << " in\n" << text;
    return "";
  }
  return text.substr(at, text.find("for (", at + 5) - at);
}

TEST(Prefetch, EveryInputEveryLineAheadInBothElementLoops) {
  Graph adamw = update_graph({{"type", "adamw"}});
  std::string text = stmt(adamw, 2048);
  std::multiset<std::string> names = prefetched_buffers(text);
  for (const char* in : {"in0_param", "in1_grad", "in2_exp_avg", "in3_exp_avg_sq"}) {
    SCOPED_TRACE(in);
    // 16 lanes x 4 bytes = one 64-byte line per vector; the loop body appears more than once
    // (the main loop and its partitioned tail), each with the same prefetches.
    EXPECT_GE(names.count(in), 1u);
    EXPECT_EQ(names.count(in), names.count("in0_param"));
  }
  EXPECT_EQ(names.size() % 4, 0u);
  // 2048 bytes = 512 f32 elements ahead of the vector being loaded.
  EXPECT_THAT(text, HasSubstr(") + 512, 1, 1)"));
  // In the parallel tasks' loop (out.s0.x.xvo.xi) and the one-task streaming loop
  // (out.s0.x.xso), each of which names its own loop variable in its prefetches; the schedule has
  // no other element loop (calls that fit one task stream too, src/lower/schedule.cpp).
  EXPECT_THAT(loop(text, "xvo.xi"), HasSubstr("prefetch(in0_param"));
  EXPECT_THAT(loop(text, "xso"), HasSubstr("prefetch(in0_param"));
  EXPECT_THAT(text, Not(HasSubstr(".s0.x.xvo, ")));
}

TEST(Prefetch, L2PrefetchesTheSameLinesFartherAhead) {
  Graph adamw = update_graph({{"type", "adamw"}});
  std::string text = stmt(adamw, 2048, 16384);
  std::multiset<std::string> near = prefetched_buffers(text);
  std::multiset<std::string> l2 = prefetched_buffers(text, Level::L2);
  ASSERT_FALSE(l2.empty()) << text;
  EXPECT_EQ(l2, near);  // one L2 prefetch beside each near one
  // 16384 bytes = 4096 f32 elements ahead.
  EXPECT_THAT(text, HasSubstr(") + 4096) + optfuse_prefetch_l2_marker(), 1, 1)"));
  EXPECT_THAT(loop(text, "xso"), HasSubstr("optfuse_prefetch_l2_marker()"));
  // bf16 params and grads (f32 master weights and state): 8192 bf16 elements, 4096 f32.
  std::string mixed =
      stmt(update_graph({{"type", "adamw"}}, {}, DType::BF16, DType::BF16), 2048, 16384);
  EXPECT_THAT(mixed, HasSubstr(") + 8192) + optfuse_prefetch_l2_marker(), 1, 1)"));
  EXPECT_THAT(mixed, HasSubstr(") + 4096) + optfuse_prefetch_l2_marker(), 1, 1)"));
}

// The buffers among `names` that are outputs ("out.3", "out$2.3"), not inputs ("in0_param").
std::set<std::string> outputs_among(const std::multiset<std::string>& names) {
  std::set<std::string> out;
  for (const std::string& n : names)
    if (n.rfind("out", 0) == 0) out.insert(n);
  return out;
}

TEST(Prefetch, OutputsNoInputReadsFirstArePrefetchedToo) {
  // bf16 params with f32 master weights: the bf16 param is only written, so its stores are the
  // only accesses to its lines, and they are prefetched like an input (near and into L2).
  std::string mixed =
      stmt(update_graph({{"type", "adamw"}}, {}, DType::BF16, DType::BF16), 2048, 16384);
  std::set<std::string> near = outputs_among(prefetched_buffers(mixed));
  ASSERT_EQ(near.size(), 1u) << mixed;
  EXPECT_EQ(outputs_among(prefetched_buffers(mixed, Level::L2)), near);
  EXPECT_THAT(mixed, HasSubstr("(bfloat16)prefetch(" + *near.begin() + ", "));
  // f32: every output overwrites an input the loop reads (and prefetches) anyway.
  Graph adamw = update_graph({{"type", "adamw"}});
  EXPECT_TRUE(outputs_among(prefetched_buffers(stmt(adamw, 2048, 16384))).empty());
  EXPECT_TRUE(outputs_among(prefetched_buffers(stmt(adamw, 2048, 16384), Level::L2)).empty());
}

TEST(Prefetch, TwoByteTypesAndWideVectorsPrefetchEachLineOnce) {
  // bf16 params (f32 master): 16 lanes x 2 bytes = half a line; f32 at 32 lanes = 2 lines.
  Graph mixed = update_graph({{"type", "adamw"}}, {}, DType::BF16, DType::BF16);
  std::string mixed_text = stmt(mixed, 1024);
  std::multiset<std::string> names = prefetched_buffers(mixed_text);
  EXPECT_GT(names.count("in1_grad"), 0u);                 // bf16, read
  EXPECT_EQ(names.count("in0_param"), 0u) << mixed_text;  // bf16, only written: never loaded
  EXPECT_THAT(mixed_text, HasSubstr(") + 512, 1, 1)"));   // bf16: 1024 bytes = 512 elements
  EXPECT_THAT(mixed_text, HasSubstr(") + 256, 1, 1)"));   // f32 master and state: 256
  // One line per vector of each: no second-line prefetch (it would be at 512 + 32, 256 + 16).
  EXPECT_THAT(mixed_text, Not(HasSubstr(") + 544, 1, 1)")));
  EXPECT_THAT(mixed_text, Not(HasSubstr(") + 272, 1, 1)")));
  Schedule wide = with_prefetch(1024);
  wide.vector_width = 32;
  std::string text =
      jit::lowered_stmt(canonicalize(update_graph({{"type", "sgd"}})), wide, kTarget);
  EXPECT_THAT(text, HasSubstr(") + 256, 1, 1)"));  // 1024 bytes = 256 f32
  EXPECT_THAT(text, HasSubstr(") + 272, 1, 1)"));  // the vector's second line
}

TEST(Prefetch, ZeroMeansNoneAndChangesTheKey) {
  Graph adamw = update_graph({{"type", "adamw"}});
  const std::string neither = stmt(adamw, 0, 0), near_only = stmt(adamw, 2048, 0),
                    l2_only = stmt(adamw, 0, 16384);
  EXPECT_THAT(neither, Not(HasSubstr("prefetch")));
  EXPECT_FALSE(prefetched_buffers(near_only).empty());
  EXPECT_TRUE(prefetched_buffers(near_only, Level::L2).empty());
  EXPECT_TRUE(prefetched_buffers(l2_only).empty());
  EXPECT_FALSE(prefetched_buffers(l2_only, Level::L2).empty());
  EXPECT_THAT(with_prefetch(0).str(), HasSubstr(".p0"));
  EXPECT_THAT(with_prefetch(4096).str(), HasSubstr(".p4096"));
  EXPECT_THAT(with_prefetch(2048, 0).str(), HasSubstr(".l0"));
  EXPECT_THAT(with_prefetch(2048, 65536).str(), HasSubstr(".l65536"));
  // The defaults: keys unchanged.
  EXPECT_THAT(with_prefetch(2048).str(), Not(HasSubstr(".p")));
  EXPECT_THAT(with_prefetch(2048).str(), Not(HasSubstr(".l")));
}

TEST(Prefetch, ObjectCodeUsesPrefetchT0AndT1) {
  // Halide 14 emits locality 0 (prefetchnta); jit/kernel_object.cpp makes it 3 (prefetcht0),
  // and each L2 prefetch call locality 2 (prefetcht1), leaving no call of the placeholder.
  Graph adamw = update_graph({{"type", "adamw"}});
  const std::string listing = testing::disassemble(
      jit::compile_kernel_object(canonicalize(adamw), with_prefetch(2048, 16384), kTarget, "k"));
  if (listing.empty()) GTEST_SKIP() << "no objdump";
  EXPECT_GE(testing::occurrences(listing, "prefetcht0"), 4u);  // at least one per input
  EXPECT_EQ(testing::occurrences(listing, "prefetcht1"),
            testing::occurrences(listing, "prefetcht0"));
  EXPECT_EQ(testing::occurrences(listing, "prefetchnta"), 0u);
  EXPECT_EQ(testing::occurrences(listing, "optfuse_prefetch_l2_marker"), 0u);
  const std::string near_only = testing::disassemble(
      jit::compile_kernel_object(canonicalize(adamw), with_prefetch(2048, 0), kTarget, "k"));
  EXPECT_EQ(testing::occurrences(near_only, "prefetcht1"), 0u);
}

TEST(Prefetch, NeverChangesAResult) {
  Engine& e = testing::shared_engine();
  // bf16 params and grads: the bf16 param is an output no input load reads (prefetched too).
  const std::pair<Options, DType> cases[] = {
      {Options{{"type", "adamw"}, {"weight_decay", 0.01}}, DType::F32},
      {Options{{"type", "sgd"}, {"momentum", 0.9}, {"nesterov", true}}, DType::F32},
      {Options{{"type", "adamw"}, {"weight_decay", 0.01}}, DType::BF16}};
  for (const auto& [config, dtype] : cases) {
    const std::string type =
        config["type"].get<std::string>() + " " + std::string(dtype_name(dtype));
    Graph g = update_graph(config, {}, dtype, dtype);
    Schedule off, far, l2_off;
    off.prefetch = 0;
    off.prefetch_l2 = 0;
    far.prefetch = 4096;
    far.prefetch_l2 = 65536;
    l2_off.prefetch_l2 = 0;
    auto base = e.kernel(g), k0 = e.kernel(g, off), k4 = e.kernel(g, far);
    auto k_near = e.kernel(g, l2_off);
    EXPECT_NE(k0->key(), base->key());
    EXPECT_NE(k_near->key(), base->key());
    // Sizes that take the parallel path (more than one task) with ragged tails.
    for (int64_t n : {int64_t(7), int64_t(40001), int64_t(1) << 18 | 5}) {
      SCOPED_TRACE(type + " n=" + std::to_string(n));
      testing::Tensors in;
      uint32_t seed = 1;
      for (const auto& t : base->signature().inputs) {
        std::vector<double> v(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) v[size_t(i)] = testing::gen(seed, uint64_t(i));
        in[t.name] = v;
        ++seed;
      }
      testing::Scalars sc;
      for (const auto& s : base->signature().scalars) sc[s.name] = 0.3;
      testing::Tensors want = testing::run_kernel(*base, in, sc);
      // Exactly equal (a NaN where the other has one: some exp_avg_sq inputs are negative).
      testing::expect_close(testing::run_kernel(*k0, in, sc), want, 0.0, 0.0);
      testing::expect_close(testing::run_kernel(*k4, in, sc), want, 0.0, 0.0);
      testing::expect_close(testing::run_kernel(*k_near, in, sc), want, 0.0, 0.0);
    }
  }
}

TEST(Prefetch, PerRowKernelsPrefetchInTheRowLoopAndKeepTheirBits) {
  // Gradient centralization: each row is reduced (its mean), then updated.
  Graph gc = update_graph({{"type", "adamw"}, {"grad_centralization", true}});
  EXPECT_THAT(stmt(gc, 2048), HasSubstr("prefetch(in1_grad"));
  EXPECT_EQ(prefetched_buffers(stmt(gc, 2048), Level::L2).count("in1_grad"),
            prefetched_buffers(stmt(gc, 2048)).count("in1_grad"));
  EXPECT_THAT(stmt(gc, 0, 0), Not(HasSubstr("prefetch")));
  Engine& e = testing::shared_engine();
  Schedule off;
  off.prefetch = 0;
  off.prefetch_l2 = 0;
  auto base = e.kernel(gc), k0 = e.kernel(gc, off);
  const int64_t cols = 777, rows = 301;  // ragged rows, several tasks
  testing::Tensors in;
  uint32_t seed = 11;
  for (const auto& t : base->signature().inputs) {
    std::vector<double> v(static_cast<size_t>(rows * cols));
    for (size_t i = 0; i < v.size(); ++i) v[i] = std::abs(testing::gen(seed, uint64_t(i)));
    in[t.name] = v;
    ++seed;
  }
  testing::Scalars sc;
  for (const auto& s : base->signature().scalars) sc[s.name] = 0.3;
  testing::RunOptions ro;
  ro.cols = cols;
  testing::Scalars unused;
  testing::Tensors want = testing::run_kernel(*base, in, sc, ro, &unused);
  testing::expect_close(testing::run_kernel(*k0, in, sc, ro, &unused), want, 0.0, 0.0);
}

}  // namespace
}  // namespace optfuse
