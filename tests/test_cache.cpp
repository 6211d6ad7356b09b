// Disk cache: hit/miss through the engine, golden key, corruption (truncate, flipped byte, swapped
// files, stale version, wrong signature), read-only directory and full disk, LRU eviction, the
// runtime object cached once per target. Objects their header does not describe:
// tests/test_cache_objects.cpp.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>

#include "cache/entry.h"
#include "jit/jit.h"
#include "jit/session.h"
#include "optfuse/cache.h"
#include "optfuse/engine.h"
#include "optfuse/error.h"
#include "support/cache_util.h"
#include "support/gen.h"
#include "support/run_kernel.h"
#include "support/scoped_env.h"

namespace optfuse {
namespace {

namespace fs = std::filesystem;
using testing::bytes_of;
using testing::check_runs;
using testing::entry_file;
using testing::expect_close;
using testing::expect_recovers;
using testing::gen;
using ::testing::HasSubstr;
using testing::read_all;
using testing::Recorded;
using testing::run_kernel;
using testing::ScopedEnv;
using testing::sgd;
using testing::TempDir;
using testing::Tensors;
using testing::write_all;

Graph momentum() {
  Graph g("momentum");
  Value p = g.param("p"), grad = g.grad("g"), b = g.state("b"), lr = g.scalar("lr");
  Value b2 = b * g.scalar("mu") + grad;
  g.output("b", b2);
  g.output("p", p - lr * b2);
  return g;
}

TEST(Cache, MissThenHitAcrossEngines) {
  TempDir dir;
  EngineOptions eo;
  eo.cache_dir = dir.path();
  {
    Engine cold(eo);
    cold.kernel(sgd());
    EXPECT_EQ(cold.counters().compiles, 1);
  }
  Engine warm(eo);
  auto k = warm.kernel(sgd("other name"));
  EngineCounters c = warm.counters();
  EXPECT_EQ(c.compiles, 0);
  EXPECT_EQ(c.runtime_compiles, 0);
  EXPECT_EQ(c.disk_hits, 2);  // the kernel and the runtime
  check_runs(*k);
  DiskCache cache({dir.path()});
  EXPECT_EQ(cache.stats().kernels, 1u);
  EXPECT_EQ(cache.stats().runtimes, 1u);
}

// Committed golden key: the same graph gives the same key in every process and build of this
// version. Update it (deliberately) when OPTFUSE_VERSION, the lowering version (engine/key.cpp),
// Halide or LLVM change.
TEST(Cache, GoldenKey) {
  EngineOptions eo;
  eo.target = "x86-64-linux-avx2";
  Engine e(eo);
  EXPECT_EQ(e.kernel_key(sgd("any")), "06c57e1de1226a6fe774d7d3c11a3f38");
}

TEST(Cache, DefaultLocation) {
  {
    ScopedEnv cache("OPTFUSE_CACHE_DIR", "/x/y");
    EXPECT_EQ(default_cache_dir(), "/x/y");
  }
  ScopedEnv cache("OPTFUSE_CACHE_DIR", nullptr);
  {
    ScopedEnv xdg("XDG_CACHE_HOME", "/xdg");
    EXPECT_EQ(default_cache_dir(), "/xdg/optfuse");
  }
  ScopedEnv xdg("XDG_CACHE_HOME", nullptr);
  EXPECT_THAT(default_cache_dir(), HasSubstr("/.cache/optfuse"));
  EXPECT_EQ(parse_size("512M"), uint64_t{512} << 20);
  EXPECT_EQ(parse_size("1GiB"), uint64_t{1} << 30);
  EXPECT_THROW(parse_size("lots"), Error);
}

TEST(Cache, EngineUsesTheDefaultLocationUnlessMemoryOnly) {
  TempDir dir;
  ScopedEnv cache("OPTFUSE_CACHE_DIR", dir.path().c_str());
  {
    Engine e;
    EXPECT_EQ(e.options().cache_dir, dir.path());
    e.kernel(sgd());
  }
  Engine warm;  // a second engine (as a second process would) loads it
  warm.kernel(sgd());
  EXPECT_EQ(warm.counters().compiles, 0);
  EXPECT_GE(warm.counters().disk_hits, 1);

  EngineOptions o;
  o.memory_only = true;
  Engine cold(o);
  EXPECT_EQ(cold.options().cache_dir, "");
  cold.kernel(sgd());
  EXPECT_EQ(cold.counters().compiles, 1);
  EXPECT_EQ(cold.counters().disk_hits, 0);
}

TEST(Cache, WarningsGoToTheEngineCallback) {
  TempDir dir;
  fs::create_directories(dir.path());
  ::chmod(dir.path().c_str(), 0777);  // other users could write: not used
  std::vector<std::string> got;
  EngineOptions o;
  o.cache_dir = dir.path();
  o.warn = [&got](const std::string& m) { got.push_back(m); };
  Engine e(o);
  check_runs(*e.kernel(sgd()));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_THAT(got[0], HasSubstr("is not used"));
  EXPECT_THAT(got[0], HasSubstr(dir.path()));
}

TEST(Cache, TruncatedEntry) {
  TempDir dir;
  expect_recovers(dir.path(), "truncated",
                  [](const std::string& p) { fs::resize_file(p, fs::file_size(p) / 2); });
}

TEST(Cache, FlippedByte) {
  TempDir dir;
  expect_recovers(dir.path(), "flipped", [](const std::string& p) {
    std::string s = read_all(p);
    s[s.size() - 100] ^= 0x10;
    write_all(p, s);
  });
}

// A FIFO in place of an entry: opening it for reading would wait for a writer forever.
TEST(Cache, FifoInPlaceOfAnEntryIsAMissNotAHang) {
  TempDir dir;
  expect_recovers(dir.path(), "fifo", [](const std::string& p) {
    fs::remove(p);
    ASSERT_EQ(::mkfifo(p.c_str(), 0600), 0);
  });
}

TEST(Cache, StaleVersion) {
  TempDir dir;
  expect_recovers(dir.path(), "stale", [](const std::string& p) {
    std::string s = read_all(p);
    std::string from = "\"optfuse_version\":\"" OPTFUSE_TEST_VERSION "\"";
    size_t at = s.find(from);
    ASSERT_NE(at, std::string::npos);
    s.replace(at, from.size(), "\"optfuse_version\":\"0.0.0\"");
    write_all(p, s);
  });
}

TEST(Cache, SwappedEntries) {
  TempDir dir;
  Recorded r(dir.path());
  Engine e;
  e.set_object_store(r.cache);
  e.kernel(momentum());
  std::string other = entry_file(*r.cache, e.kernel_key(momentum()));
  expect_recovers(dir.path(), "swapped", [&](const std::string& p) {
    fs::copy_file(other, p, fs::copy_options::overwrite_existing);
  });
}

TEST(Cache, WrongSignatureIsAMiss) {
  TempDir dir;
  Recorded r(dir.path());
  ObjectInfo a{"kernel", "k", "t", "in p param f32\n"}, b{"kernel", "k", "t", "in p param f64\n"};
  r.cache->put("abcd", a, bytes_of("object"));
  std::vector<char> got;
  EXPECT_TRUE(r.cache->get("abcd", a, &got));
  EXPECT_EQ(got, bytes_of("object"));
  EXPECT_FALSE(r.cache->get("abcd", b, &got));
  ASSERT_EQ(r.warnings->size(), 1u);
  EXPECT_THAT((*r.warnings)[0], HasSubstr("signature"));
}

TEST(Cache, GarbageNeverCrashes) {
  TempDir dir;
  Recorded r(dir.path());
  r.cache->put("abcd", bytes_of("object"));
  std::string path = entry_file(*r.cache, "abcd");
  std::string good = read_all(path);
  for (size_t cut = 0; cut < good.size(); cut += 7) {
    write_all(path, good.substr(0, cut));
    std::vector<char> got;
    EXPECT_FALSE(r.cache->get("abcd", &got)) << cut;
  }
  write_all(path, "optfuse-cache-entry 2\n{\"format\":2,\"key\":[1]}\n");
  std::vector<char> got;
  EXPECT_FALSE(r.cache->get("abcd", &got));
}

TEST(Cache, UnwritableDirectoryDegradesToMemory) {
  TempDir dir;
  write_all(dir.path(), "a file, not a directory");  // mkdir under it fails, even for root
  Recorded r(dir.path() + "/cache");
  EXPECT_TRUE(r.cache->degraded());
  r.cache->put("k1", bytes_of("one"));
  r.cache->put("k2", bytes_of("two"));
  std::vector<char> got;
  EXPECT_TRUE(r.cache->get("k1", &got));
  EXPECT_EQ(got, bytes_of("one"));
  EXPECT_EQ(r.warnings->size(), 1u);
  fs::remove(dir.path());

  if (::geteuid() != 0) {  // permissions bind only non-root users
    TempDir ro;
    Recorded seed(ro.path());
    seed.cache->put("k1", bytes_of("one"));
    fs::permissions(ro.path(), fs::perms::owner_read | fs::perms::owner_exec);
    fs::permissions(ro.path() + "/v1", fs::perms::owner_read | fs::perms::owner_exec);
    fs::permissions(fs::path(entry_file(*seed.cache, "k1")).parent_path(),
                    fs::perms::owner_read | fs::perms::owner_exec);
    Recorded r2(ro.path());
    EXPECT_TRUE(r2.cache->get("k1", &got));  // a read-only warm cache still serves
    r2.cache->put("k2", bytes_of("two"));
    r2.cache->put("k3", bytes_of("three"));
    EXPECT_TRUE(r2.cache->get("k2", &got));
    EXPECT_TRUE(r2.cache->degraded());
    EXPECT_EQ(r2.warnings->size(), 1u);
  }
}

// A full disk, simulated by a file size limit in a child process: writes fail with EFBIG.
// A cache directory every user can write to could be handed another user's code: such a cache
// is neither read (an entry put there before is not used) nor written.
TEST(Cache, WorldWritableDirectoryIsNotUsed) {
  TempDir dir;
  {
    Recorded trusted(dir.path());
    Engine a;
    a.set_object_store(trusted.cache);
    a.kernel(sgd());
    EXPECT_EQ(trusted.cache->stats().writes, 2u);  // the kernel and the Halide runtime
  }
  fs::permissions(dir.path(), fs::perms::others_write, fs::perm_options::add);
  Recorded shared(dir.path());
  ASSERT_EQ(shared.warnings->size(), 1u);
  EXPECT_THAT((*shared.warnings)[0], HasSubstr("writable by all users"));
  EXPECT_TRUE(shared.cache->degraded());
  Engine b;
  b.set_object_store(shared.cache);
  check_runs(*b.kernel(sgd()));
  EXPECT_EQ(b.counters().compiles, 1);  // compiled, not loaded from the directory
  EXPECT_EQ(shared.cache->stats().writes, 0u);
  fs::permissions(dir.path(), fs::perms::others_write, fs::perm_options::remove);
}

TEST(Cache, FullDiskDegradesToMemory) {
  TempDir dir;
  fs::create_directories(dir.path());
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    std::signal(SIGXFSZ, SIG_IGN);
    rlimit lim{100, 100};
    ::setrlimit(RLIMIT_FSIZE, &lim);
    Recorded r(dir.path());
    std::vector<char> big(5000, 'x'), got;
    r.cache->put("k1", big);
    r.cache->put("k2", big);
    bool ok = r.cache->degraded() && r.warnings->size() == 1 && r.cache->get("k1", &got) &&
              got == big && r.cache->list().empty();
    ::_exit(ok ? 0 : 1);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

TEST(Cache, EvictsLeastRecentlyUsed) {
  TempDir dir, probe;
  std::vector<char> obj(1000, 'o'), got;
  Recorded sizer(probe.path());
  sizer.cache->put("z", obj);
  uint64_t size = fs::file_size(entry_file(*sizer.cache, "z"));  // one entry's file
  Recorded r(dir.path(), /*max_bytes=*/3 * size + size / 2);
  auto age = [&](const std::string& key, int seconds_ago) {
    fs::last_write_time(entry_file(*r.cache, key),
                        fs::file_time_type::clock::now() - std::chrono::seconds(seconds_ago));
  };
  r.cache->put("a", obj);
  age("a", 300);
  r.cache->put("b", obj);
  age("b", 200);
  r.cache->put("c", obj);
  age("c", 100);
  ASSERT_TRUE(r.cache->get("a", &got));  // a is now the most recently used
  r.cache->put("d", obj);                // over the cap: b goes first
  EXPECT_FALSE(r.cache->get("b", &got));
  EXPECT_TRUE(r.cache->get("a", &got));
  EXPECT_TRUE(r.cache->get("c", &got));
  EXPECT_TRUE(r.cache->get("d", &got));
  EXPECT_EQ(r.cache->stats().evictions, 1u);
  auto removed = r.cache->prune(size + size / 2);  // keeps only the most recently used
  EXPECT_EQ(removed.size(), 2u);
  std::vector<CacheEntry> left = r.cache->list();
  ASSERT_EQ(left.size(), 1u);
  EXPECT_EQ(left[0].key, "d");
  r.cache->clear();
  EXPECT_TRUE(r.cache->list().empty());
}

TEST(Cache, RuntimeCachedOncePerTarget) {
  TempDir dir;
  EngineOptions eo;
  eo.cache_dir = dir.path();
  Engine host(eo);
  host.kernel(sgd());
  host.kernel(momentum());
  EXPECT_TRUE(host.precompile_runtime());  // already stored
  eo.target = "x86-64-linux-avx2";
  Engine cross(eo);
  EXPECT_FALSE(cross.precompile(sgd()));  // compile only, nothing loaded
  EXPECT_FALSE(cross.precompile_runtime());
  EXPECT_TRUE(cross.precompile_runtime());
  EXPECT_TRUE(cross.precompile(sgd()));
  std::map<std::string, int> runtimes;
  int kernels = 0;
  for (const CacheEntry& e : DiskCache({dir.path()}).list(true)) {
    EXPECT_EQ(e.problem, "");
    if (e.kind == "runtime") ++runtimes[e.target];
    if (e.kind == "kernel") ++kernels;
  }
  EXPECT_EQ(runtimes.size(), 2u);
  for (const auto& [target, n] : runtimes) EXPECT_EQ(n, 1) << target;
  EXPECT_EQ(kernels, 3);
}

TEST(Cache, LockIsExclusiveAndReleased) {
  TempDir dir;
  Recorded r(dir.path());
  CacheOptions quick{dir.path(), uint64_t{1} << 30, /*lock_timeout_s=*/0.05};
  DiskCache other(quick);
  {
    auto held = r.cache->lock("k");
    ASSERT_TRUE(held);
    EXPECT_FALSE(other.lock("k"));  // times out instead of waiting forever
    EXPECT_TRUE(other.lock("j"));   // other keys are independent
  }
  EXPECT_TRUE(other.lock("k"));
}

// A holder that dies (SIGKILL, no clean-up) never blocks the others: the kernel drops its flock.
TEST(Cache, DeadHolderReleasesTheLock) {
  TempDir dir;
  Recorded r(dir.path());
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    auto held = r.cache->lock("k");
    char c = held ? 'y' : 'n';
    (void)!::write(ready[1], &c, 1);
    ::pause();
    ::_exit(0);
  }
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ASSERT_EQ(c, 'y');
  CacheOptions quick{dir.path(), uint64_t{1} << 30, /*lock_timeout_s=*/0.05};
  DiskCache other(quick);
  EXPECT_FALSE(other.lock("k"));
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  EXPECT_TRUE(other.lock("k"));
  ::close(ready[0]);
  ::close(ready[1]);
}

}  // namespace
}  // namespace optfuse
