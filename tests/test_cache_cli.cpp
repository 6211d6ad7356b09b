// The `optfuse warmup` and `optfuse cache` commands as separate processes: several processes
// warming one empty directory at once, key stability across processes, a warm demo that compiles
// nothing, maintenance sub-commands and their error messages.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "optfuse/optfuse.hpp"
#include "support/cache_util.h"
#include "support/cli.h"

namespace optfuse {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

const std::string kTinySpec = std::string(OPTFUSE_TEST_DATA_DIR) + "/specs/tiny.json";

using Result = testing::CliResult;

class CacheCli : public testing::CliTest {
 protected:
  void SetUp() override {
    CliTest::SetUp();
    // Default schedules only: these tests compare keys with an engine that has no tuned ones.
    ::setenv("OPTFUSE_SCHEDULES", "none", 1);
  }
};

TEST_F(CacheCli, FourProcessesWarmOneDirectoryAtOnce) {
  std::vector<pid_t> pids;
  for (int i = 0; i < 4; ++i)
    pids.push_back(
        testing::start_cli({"warmup", "--spec", kTinySpec, "--cache-dir", cache(), "--json"},
                           dir() + "/io/w" + std::to_string(i)));
  int64_t misses = 0, runtime_misses = 0;
  std::string key;
  for (int i = 0; i < 4; ++i) {
    Result r = testing::finish_cli(pids[i], dir() + "/io/w" + std::to_string(i));
    ASSERT_EQ(r.rc, 0) << r.err;
    EXPECT_THAT(r.err, HasSubstr("[3/3]"));  // progress
    nlohmann::json j = r.json();
    EXPECT_EQ(j["kernels"], 2);
    EXPECT_EQ(j["hits"].get<int>() + j["misses"].get<int>(), 2);
    misses += j["misses"].get<int64_t>();
    runtime_misses += j["runtime_misses"].get<int64_t>();
    for (const auto& item : j["items"])
      if (item["name"] == "sgd_momentum") {
        EXPECT_EQ(item["groups"], 2);  // one kernel serves both groups without Nesterov
        EXPECT_EQ(item["tensors"], 3);
        key = item["key"];
      }
  }
  EXPECT_EQ(misses, 2);  // each kernel compiled by exactly one process (the lock)
  EXPECT_EQ(runtime_misses, 1);
  Result v = cli({"cache", "verify", "--cache-dir", cache(), "--json"});
  ASSERT_EQ(v.rc, 0) << v.out << v.err;
  EXPECT_EQ(v.json()["entries"], 3);
  EXPECT_EQ(v.json()["invalid"], 0);

  // Key stability across processes: this process computes the key the CLI stored.
  Engine e;
  EXPECT_EQ(e.kernel_key(update_graph({{"type", "sgd"}, {"lr", 0.01}, {"momentum", 0.9}},
                                      {{"weight_decay", 0.0}})),
            key);
}

// 16-bit params in a spec (tests/specs/tiny_bf16.json: bf16 and f16 params, an f32 grad, bf16
// state, groups with and without master weights): warmup compiles one kernel per group, and an
// optimizer over such tensors in another process (this one) finds every kernel in the cache.
TEST_F(CacheCli, SixteenBitSpecWarmsWhatAStepInAnotherProcessLoads) {
  const std::string spec = std::string(OPTFUSE_TEST_DATA_DIR) + "/specs/tiny_bf16.json";
  Result r = cli({"warmup", "--spec", spec, "--cache-dir", cache(), "--json"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.json()["kernels"], 4);

  EngineOptions eo;
  eo.cache_dir = cache();
  Engine e(eo);
  auto opt = Optimizer::create(e, {{"type", "adamw"}, {"lr", 1e-3}});
  auto bits = [](size_t n) { return std::vector<uint16_t>(n, 0x3f80); };  // 1.0 in bf16
  std::vector<uint16_t> embed = bits(1600), embed_g = bits(1600), bias = bits(16),
                        bias_g = bits(16), head = bits(160), norm(16, 0x3c00), norm_g(16, 0);
  std::vector<float> head_g(160, 0.5f);
  const DType b = DType::BF16;
  opt->add_param_group({{{bias.data(), 16, {16}, b}, {bias_g.data(), 16, {16}, b}, "embed.bias"}},
                       {{"weight_decay", 0.0}, {"master_weights", false}});
  opt->add_param_group({{{head.data(), 160, {16, 10}, b}, {head_g.data(), 160, {16, 10}}, "head"}},
                       {{"state_dtype", "bf16"}});
  opt->add_param_group(
      {{{norm.data(), 16, {16}, DType::F16}, {norm_g.data(), 16, {16}, DType::F16}, "norm.weight"}},
      {{"master_weights", false}});
  opt->add_param_group(
      {{{embed.data(), 1600, {100, 16}, b}, {embed_g.data(), 1600, {100, 16}, b}, "embed"}});
  opt->step();
  EXPECT_EQ(e.counters().compiles, 0);
  EXPECT_GE(e.counters().disk_hits, 4);
}

TEST_F(CacheCli, EightBitStateSpecWarmsBothKernelsAStepLoads) {
  // "state_dtype": "int8": the 1600-element embedding (>= min_8bit_size 1024) runs the 8-bit
  // kernel, the 160-element head the f32-state one; warm-up compiles both, a step compiles none.
  const std::string spec = std::string(OPTFUSE_TEST_DATA_DIR) + "/specs/tiny_int8.json";
  Result r = cli({"warmup", "--spec", spec, "--cache-dir", cache(), "--json"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.json()["kernels"], 2);

  EngineOptions eo;
  eo.cache_dir = cache();
  Engine e(eo);
  auto opt = Optimizer::create(
      e, {{"type", "adamw"}, {"lr", 1e-3}, {"state_dtype", "int8"}, {"min_8bit_size", 1024}});
  std::vector<float> embed(1600, 1.0f), embed_g(1600, 0.5f), head(160, 1.0f), head_g(160, 0.5f);
  opt->add_param_group({{{embed.data(), 1600, {100, 16}}, {embed_g.data(), 1600}, "embed.weight"},
                        {{head.data(), 160, {16, 10}}, {head_g.data(), 160}, "head.weight"}});
  opt->step();
  EXPECT_EQ(e.counters().compiles, 0);
  EXPECT_GE(e.counters().disk_hits, 2);
  EXPECT_EQ(opt->state_ref(0, 0, "exp_avg").dtype, DType::U8);
  EXPECT_EQ(opt->state_ref(0, 1, "exp_avg").dtype, DType::F32);
}

// Adadelta, ASGD, Rprop and Muon specs (tests/specs/tiny_*.json): each warms one kernel for all
// its groups (their options are runtime scalars; Muon's is two compiled objects around its
// orthogonalization, which needs no compiling), and the optimizer a spec describes, stepped in
// this process, loads it: warm-up's objects are the step's.
TEST_F(CacheCli, ElementwiseRuleSpecsWarmWhatAStepLoads) {
  for (const char* model : {"tiny_adadelta", "tiny_asgd", "tiny_rprop", "tiny_muon"}) {
    SCOPED_TRACE(model);
    const std::string spec = std::string(OPTFUSE_TEST_DATA_DIR) + "/specs/" + model + ".json";
    Result r = cli({"warmup", "--spec", spec, "--cache-dir", cache(), "--json"});
    ASSERT_EQ(r.rc, 0) << r.err;
    EXPECT_EQ(r.json()["kernels"], 1);
    EXPECT_EQ(r.json()["misses"], 1);

    std::ifstream in(spec);
    const nlohmann::json j = nlohmann::json::parse(in);
    EngineOptions eo;
    eo.cache_dir = cache();
    Engine e(eo);
    auto opt = Optimizer::create(e, j["optimizer"]);
    std::vector<std::vector<float>> buffers;
    for (const auto& t : j["parameters"]) {
      int64_t n = 1;
      for (int64_t d : t["shape"]) n *= d;
      buffers.emplace_back(size_t(n), 0.5f);   // param
      buffers.emplace_back(size_t(n), 0.25f);  // grad
    }
    // One group per tensor, one of them with the first spec group's values: the same kernel.
    for (size_t i = 0; i < j["parameters"].size(); ++i) {
      const auto& t = j["parameters"][i];
      const int64_t n = int64_t(buffers[2 * i].size());
      Options overrides = i == 2 ? j["param_groups"][0] : Options::object();
      overrides.erase("params");
      overrides.erase("match");
      opt->add_param_group({{{buffers[2 * i].data(), n, t["shape"].get<std::vector<int64_t>>()},
                             {buffers[2 * i + 1].data(), n},
                             t["name"].get<std::string>()}},
                           overrides);
    }
    opt->step();
    EXPECT_EQ(e.counters().compiles, 0);
    EXPECT_GE(e.counters().disk_hits, 1);
  }
}

// Adafactor (tests/specs/tiny_adafactor.json): two kernels, the factored one for the params of
// two or more dims (a matrix, a conv weight factored per 3 x 3 kernel) and the vector one for
// the biases, whatever the groups' values; an optimizer stepping those params loads both.
TEST_F(CacheCli, AdafactorSpecWarmsItsFactoredAndVectorKernels) {
  const std::string spec = std::string(OPTFUSE_TEST_DATA_DIR) + "/specs/tiny_adafactor.json";
  Result r = cli({"warmup", "--spec", spec, "--cache-dir", cache(), "--json"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.json()["kernels"], 2);
  EngineOptions eo;
  eo.cache_dir = cache();
  Engine e(eo);
  auto opt = Optimizer::create(e, {{"type", "adafactor"}, {"weight_decay", 0.01}});
  std::ifstream in(spec);
  const nlohmann::json j = nlohmann::json::parse(in);
  std::vector<std::vector<float>> buffers;
  std::vector<ParamRef> refs;
  for (const auto& t : j["parameters"]) {
    const std::vector<int64_t> shape = t["shape"].get<std::vector<int64_t>>();
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    buffers.emplace_back(size_t(n), 0.5f);
    buffers.emplace_back(size_t(n), 0.25f);
  }
  for (size_t i = 0; i < j["parameters"].size(); ++i) {
    const auto& t = j["parameters"][i];
    const int64_t n = int64_t(buffers[2 * i].size());
    refs.push_back({{buffers[2 * i].data(), n, t["shape"].get<std::vector<int64_t>>()},
                    {buffers[2 * i + 1].data(), n},
                    t["name"].get<std::string>()});
  }
  opt->add_param_group(refs);
  opt->step();
  EXPECT_EQ(e.counters().compiles, 0);
  EXPECT_GE(e.counters().disk_hits, 2);
  EXPECT_EQ(opt->kernel_uses().size(), 2u);
}

TEST_F(CacheCli, WarmDemoCompilesNothing) {
  std::vector<std::string> demo = {"demo", "--cache-dir", cache(), "--layers", "1", "--d-model",
                                   "64",   "--vocab",     "256",   "--steps",  "1", "--json"};
  Result cold = cli(demo);
  ASSERT_EQ(cold.rc, 0) << cold.err;
  EXPECT_GE(cold.json()["kernels_compiled"], 1);
  Result warm = cli(demo);
  ASSERT_EQ(warm.rc, 0) << warm.err;
  nlohmann::json j = warm.json();
  EXPECT_EQ(j["kernels_compiled"], 0);
  EXPECT_EQ(j["runtime_compiles"], 0);
  EXPECT_GE(j["disk_hits"], 2);
  // The unfused baseline ran (f32 AdamW): torch's 8 passes move 80 B/element.
  EXPECT_EQ(j["unfused_bytes_per_element"], 80);
  EXPECT_GT(j["speedup_over_unfused"].get<double>(), 0.0);
  // Reported, not asserted (timings belong in benchmarks: bench/warm_start.sh).
  std::printf("start-up: cold %.1f ms, warm %.1f ms\n", cold.json()["startup_ms"].get<double>(),
              j["startup_ms"].get<double>());
}

TEST_F(CacheCli, LsStatsPruneClear) {
  ASSERT_EQ(cli({"warmup", "--spec", kTinySpec, "--cache-dir", cache()}).rc, 0);
  Result ls = cli({"cache", "ls", "--cache-dir", cache(), "--json"});
  ASSERT_EQ(ls.rc, 0);
  EXPECT_EQ(ls.json().size(), 3u);
  Result stats = cli({"cache", "stats", "--cache-dir", cache(), "--json"});
  EXPECT_EQ(stats.json()["kernels"], 2);
  EXPECT_EQ(stats.json()["runtimes"], 1);

  // A corrupt entry: verify names it and fails, prune removes it.
  std::string victim = ls.json()[0]["path"];
  fs::resize_file(victim, 10);
  Result bad = cli({"cache", "verify", "--cache-dir", cache()});
  EXPECT_EQ(bad.rc, 1);
  EXPECT_THAT(bad.out, HasSubstr(victim));
  Result pruned = cli({"cache", "prune", "--cache-dir", cache(), "--json"});
  EXPECT_EQ(pruned.json()["removed"], 1);
  EXPECT_EQ(cli({"cache", "verify", "--cache-dir", cache()}).rc, 0);
  Result evict = cli({"cache", "prune", "--cache-dir", cache(), "--max-size", "1k", "--json"});
  EXPECT_EQ(evict.json()["removed"], 2);
  ASSERT_EQ(cli({"warmup", "--spec", kTinySpec, "--cache-dir", cache()}).rc, 0);
  Result cleared = cli({"cache", "clear", "--cache-dir", cache(), "--json"});
  EXPECT_EQ(cleared.json()["removed"], 3);
  EXPECT_EQ(cli({"cache", "ls", "--cache-dir", cache(), "--json"}).json().size(), 0u);
}

TEST_F(CacheCli, CrossTargetsIncludingCudaWithoutAGpu) {
  Result r = cli({"warmup", "--spec", kTinySpec, "--cache-dir", cache(), "--target",
                  "arm-64-linux,host-cuda,host-cuda-cuda_capability_80", "--json"});
  EXPECT_EQ(r.rc, 0) << r.err;  // compiling for CUDA needs no driver or device
  nlohmann::json j = r.json();
  EXPECT_EQ(j["misses"], 6);  // 2 kernels per target
  EXPECT_EQ(j["failed"], 0);
  EXPECT_EQ(j["runtime_misses"], 3);
  r = cli({"warmup", "--spec", kTinySpec, "--cache-dir", cache(), "--target",
           "host-cuda-cuda_capability_80", "--json"});
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.json()["hits"], 2);
  EXPECT_EQ(r.json()["runtime_hits"], 1);
  // verify links what this machine can link (the CUDA targets' host code) and finds it sound.
  Result v = cli({"cache", "verify", "--cache-dir", cache(), "--json"});
  EXPECT_EQ(v.rc, 0) << v.out << v.err;
  EXPECT_EQ(v.json()["invalid"], 0);
}

TEST_F(CacheCli, OtherGpuApisAreReported) {
  Result r = cli(
      {"warmup", "--spec", kTinySpec, "--cache-dir", cache(), "--target", "host-opencl", "--json"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_EQ(r.json()["failed"], 2);  // the kernels; the runtime compiles
  EXPECT_THAT(r.err, HasSubstr("only the CUDA GPU backend is supported"));
}

TEST_F(CacheCli, SpecErrorsNameTheFile) {
  std::string bad = dir() + "/bad.json";
  std::ofstream(bad) << R"({"optimizer": {"type": "sgd"}, "parameters": [
      {"name": "w", "shape": [2, 2], "dtype": "float64"}]})";
  Result r = cli({"warmup", "--spec", bad, "--cache-dir", cache()});
  EXPECT_EQ(r.rc, 1);
  EXPECT_THAT(r.err, HasSubstr(bad + ": parameters[0] ('w'): dtype float64 is not supported "
                                     "(float32, bfloat16 or float16, as torch names them)"));
  std::ofstream(bad) << R"({"optimizer": {"type": "sgd"}, "parameters": [
      {"name": "w", "shape": [2], "dtype": "bfloat16"}, {"name": "b", "shape": [2]}]})";
  r = cli({"warmup", "--spec", bad, "--cache-dir", cache()});
  EXPECT_EQ(r.rc, 1);
  EXPECT_THAT(r.err, HasSubstr(bad + ": param_groups[0]: parameter 'b' (f32, grad f32) differs "
                                     "from 'w' (bf16, grad bf16); one group has one param dtype"));
  std::ofstream(bad) << R"({"optimizer": {"type": "sgd", "lr": -1}, "parameters": [
      {"name": "w", "shape": [2]}]})";
  r = cli({"warmup", "--spec", bad, "--cache-dir", cache()});
  EXPECT_EQ(r.rc, 1);
  EXPECT_THAT(r.err, HasSubstr(bad + ": param_groups[0]: "));
  EXPECT_THAT(r.err, HasSubstr("Invalid learning rate"));
}

TEST_F(CacheCli, HelpOnEveryCommand) {
  for (auto args : std::vector<std::vector<std::string>>{{"warmup", "--help"},
                                                         {"cache", "--help"},
                                                         {"cache", "ls", "--help"},
                                                         {"cache", "stats", "--help"},
                                                         {"cache", "verify", "--help"},
                                                         {"cache", "prune", "--help"},
                                                         {"cache", "clear", "--help"},
                                                         {"demo", "--help"}}) {
    Result r = cli(args);
    EXPECT_EQ(r.rc, 0) << args[0];
    EXPECT_THAT(r.out, HasSubstr("--")) << args[0];
  }
}

// The path of an entry of `kind` in `ls --json` output of `dir` ("" if none).
std::string listed_path(const nlohmann::json& ls, const std::string& kind, size_t nth = 0) {
  for (const auto& e : ls)
    if (e["kind"] == kind && nth-- == 0) return e["path"];
  return "";
}

// Before: verify and prune read a 1 TiB sparse entry into memory and died of std::bad_alloc
// (exit 134), so prune could never remove it.
TEST_F(CacheCli, TerabyteSparseEntryIsReportedAndPruned) {
  ASSERT_EQ(cli({"warmup", "--spec", kTinySpec, "--cache-dir", cache()}).rc, 0);
  const std::string victim =
      listed_path(cli({"cache", "ls", "--cache-dir", cache(), "--json"}).json(), "kernel");
  ASSERT_FALSE(victim.empty());
  fs::resize_file(victim, uint64_t{1} << 40);
  Result bad = cli({"cache", "verify", "--cache-dir", cache()});
  EXPECT_EQ(bad.rc, 1) << bad.err;
  EXPECT_THAT(bad.out, HasSubstr("INVALID " + victim + ": " + victim +
                                 " is 1099511627776 bytes, more than the 268435456 bytes allowed"));
  Result pruned = cli({"cache", "prune", "--cache-dir", cache(), "--json"});
  EXPECT_EQ(pruned.rc, 0) << pruned.err;
  EXPECT_EQ(pruned.json()["removed"], 1);
  EXPECT_FALSE(fs::exists(victim));
  EXPECT_EQ(cli({"cache", "verify", "--cache-dir", cache()}).rc, 0);
}

// Before: verify checked checksums only, and another kernel's object under a header with
// consistent checksums passed ("0 invalid") though no process could load it.
TEST_F(CacheCli, VerifyReportsAForgedEntryThatDoesNotLink) {
  ASSERT_EQ(cli({"warmup", "--spec", kTinySpec, "--cache-dir", cache()}).rc, 0);
  const nlohmann::json ls = cli({"cache", "ls", "--cache-dir", cache(), "--json"}).json();
  const std::string a = listed_path(ls, "kernel", 0), b = listed_path(ls, "kernel", 1);
  ASSERT_FALSE(a.empty() || b.empty());
  testing::Entry forged = testing::read_entry(a);
  forged.object = testing::read_entry(b).object;
  testing::write_entry(a, forged);
  Result v = cli({"cache", "verify", "--cache-dir", cache()});
  EXPECT_EQ(v.rc, 1) << v.out << v.err;
  EXPECT_THAT(v.out, HasSubstr("INVALID " + a + ": it does not link"));
  EXPECT_THAT(v.out, HasSubstr("3 entries checked, 1 invalid"));
  // prune removes it, and warmup (which compiles, never loads) makes it again.
  Result pruned = cli({"cache", "prune", "--cache-dir", cache(), "--json"});
  EXPECT_EQ(pruned.json()["removed"], 1) << pruned.out;
  ASSERT_EQ(cli({"warmup", "--spec", kTinySpec, "--cache-dir", cache()}).rc, 0);
  Result again = cli({"cache", "verify", "--cache-dir", cache()});
  EXPECT_EQ(again.rc, 0) << again.out << again.err;
}

// Before: `cache stats --cache-dir TYPO` reported an empty cache, exited 0 and created TYPO.
TEST_F(CacheCli, NoCacheAtTheDirectoryIsAnErrorAndNothingIsCreated) {
  const std::string typo = dir() + "/typo";
  for (const char* what : {"ls", "stats", "verify", "prune", "clear"}) {
    Result r = cli({"cache", what, "--cache-dir", typo});
    EXPECT_EQ(r.rc, 1) << what << ": " << r.out << r.err;
    EXPECT_THAT(r.err, HasSubstr("optfuse: error: no cache at " + typo + " (no such directory"))
        << what;
    EXPECT_FALSE(fs::exists(typo)) << what;
  }
  fs::create_directories(typo);  // a directory, but no cache in it
  Result r = cli({"cache", "stats", "--cache-dir", typo});
  EXPECT_EQ(r.rc, 1);
  EXPECT_THAT(r.err, HasSubstr("no cache at " + typo + " (it has no v1/ directory"));
  EXPECT_FALSE(fs::exists(typo + "/v1"));
}

// Before: exit status 1, where every other usage error exits 2.
TEST_F(CacheCli, PruneWithAnUnreadableSizeIsAUsageError) {
  ASSERT_EQ(cli({"warmup", "--spec", kTinySpec, "--cache-dir", cache()}).rc, 0);
  Result r = cli({"cache", "prune", "--cache-dir", cache(), "--max-size", "10Q"});
  EXPECT_EQ(r.rc, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("--max-size: size '10Q' must be a number with an optional unit"));
  EXPECT_EQ(cli({"cache", "ls", "--cache-dir", cache(), "--json"}).json().size(), 3u);
}

// Before: clear left every lock file behind. A lock a live process holds stays: its file is its
// lock, and removing it would let a second compiler in.
TEST_F(CacheCli, ClearRemovesLockFilesNobodyHolds) {
  ASSERT_EQ(cli({"warmup", "--spec", kTinySpec, "--cache-dir", cache()}).rc, 0);
  const std::string locks = cache() + "/v1/locks";
  ASSERT_FALSE(fs::is_empty(locks));
  DiskCache mine(engine_cache_options(cache()));
  auto held = mine.lock("heldkey");
  ASSERT_TRUE(held);
  Result r = cli({"cache", "clear", "--cache-dir", cache(), "--json"});
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.json()["removed"], 3);
  EXPECT_EQ(r.json()["locks_held"], 1);
  std::vector<std::string> left;
  for (const auto& f : fs::directory_iterator(locks)) left.push_back(f.path().filename());
  EXPECT_EQ(left, std::vector<std::string>{"heldkey.lock"});
  held.reset();
  EXPECT_EQ(cli({"cache", "clear", "--cache-dir", cache(), "--json"}).json()["locks_held"], 0);
  EXPECT_TRUE(fs::is_empty(locks));
}

// Before: under umask 000 every process made the cache's directories 0777, refused them as
// writable by all users and ran memory-only; warmup failed with "nothing can be cached".
TEST_F(CacheCli, UmaskZeroStillCaches) {
  const mode_t old = ::umask(0);  // the child inherits it
  Result r = cli({"warmup", "--spec", kTinySpec, "--cache-dir", cache(), "--json"});
  ::umask(old);
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_EQ(r.json()["not_cached"], 0);
  EXPECT_EQ(cli({"cache", "ls", "--cache-dir", cache(), "--json"}).json().size(), 3u);
  for (const auto& d : fs::recursive_directory_iterator(cache()))
    EXPECT_EQ(fs::status(d.path()).permissions() & fs::perms::others_write, fs::perms::none)
        << d.path();
}

// A cache that cannot be used says so once, with the reason and the fix, however many engines
// the process makes (the demo makes several).
TEST_F(CacheCli, AnUnusableCacheSaysSoOnceWithTheFix) {
  fs::create_directories(cache());
  fs::permissions(cache(), fs::perms::others_write, fs::perm_options::add);
  Result r = cli({"demo", "--cache-dir", cache(), "--layers", "1", "--d-model", "64", "--vocab",
                  "256", "--steps", "1", "--json"});
  ASSERT_EQ(r.rc, 0) << r.err;
  const std::string warning = "optfuse: warning: kernel cache " + cache() +
                              " is not used: " + cache() + " is writable by all users (mode 0757)";
  EXPECT_THAT(r.err, HasSubstr(warning));
  EXPECT_THAT(r.err, HasSubstr("fix: chmod o-w " + cache()));
  EXPECT_EQ(r.err.find(warning), r.err.rfind(warning)) << r.err;  // once
  Result v = cli({"cache", "verify", "--cache-dir", cache()});
  EXPECT_EQ(v.rc, 1);
  EXPECT_THAT(v.out, HasSubstr("NOT USED " + cache()));
}

}  // namespace
}  // namespace optfuse
