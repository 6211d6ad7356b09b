// The disk cache under hostile and careless use (cache/README.md, "Trust" and "What a read
// checks"): a terabyte sparse file or a directory in place of an entry, a temporary file a dead
// writer left under this process's pid, umask 000, every level of the tree not trusted (writable
// by all, owned by another user, a symlink), and forged entries that pass every checksum but do
// not link. Each is a miss with one warning, never an abort, an error or a memory-only process.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "optfuse/cache.h"
#include "optfuse/engine.h"
#include "support/cache_util.h"

namespace optfuse {
namespace {

namespace fs = std::filesystem;
using testing::bytes_of;
using testing::check_runs;
using testing::Entry;
using testing::entry_file;
using testing::expect_recovers;
using ::testing::HasSubstr;
using testing::read_all;
using testing::read_entry;
using testing::Recorded;
using testing::sgd;
using testing::TempDir;
using testing::write_all;
using testing::write_entry;

constexpr uint64_t kTerabyte = uint64_t{1} << 40;
constexpr uid_t kNobody = 65534;

Graph momentum() {
  Graph g("momentum");
  Value p = g.param("p"), grad = g.grad("g"), b = g.state("b"), lr = g.scalar("lr");
  Value b2 = b * g.scalar("mu") + grad;
  g.output("b", b2);
  g.output("p", p - lr * b2);
  return g;
}

mode_t mode_of(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::lstat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

// The problem list(verify) reports for the entry at `path` ("" if valid, "absent" if unlisted).
std::string problem_of(const DiskCache& c, const std::string& path) {
  for (const CacheEntry& e : c.list(/*verify=*/true))
    if (e.path == path) return e.problem;
  return "absent";
}

// Before: the reader allocated the file's size (1 TiB) and the process died of std::bad_alloc.
TEST(CacheHostile, TerabyteSparseEntryIsAMiss) {
  TempDir dir;
  expect_recovers(
      dir.path(), "sparse", [](const std::string& p) { fs::resize_file(p, kTerabyte); },
      "is 1099511627776 bytes, more than the 268435456 bytes allowed");
}

TEST(CacheHostile, TerabyteSparseEntryIsReportedAndPruned) {
  TempDir dir;
  Recorded r(dir.path());
  r.cache->put("abcd", bytes_of("object"));
  const std::string path = entry_file(*r.cache, "abcd");
  fs::resize_file(path, kTerabyte);
  EXPECT_THAT(problem_of(*r.cache, path), HasSubstr("more than the 268435456 bytes allowed"));
  std::vector<CacheEntry> removed = r.cache->prune(uint64_t{1} << 30);
  ASSERT_EQ(removed.size(), 1u);
  EXPECT_EQ(removed[0].path, path);
  EXPECT_FALSE(fs::exists(path));
}

// Before: a directory under an entry's name was never listed, never removed, and every process
// warned about it and then failed to write the entry.
TEST(CacheHostile, DirectoryInPlaceOfAnEntryIsAMiss) {
  TempDir dir;
  expect_recovers(
      dir.path(), "directory",
      [](const std::string& p) {
        fs::remove(p);
        fs::create_directories(p + "/inside");
        write_all(p + "/inside/file", "x");
      },
      "is not a regular file (a directory)");
}

TEST(CacheHostile, DirectoryInPlaceOfAnEntryIsReportedAndPruned) {
  TempDir dir;
  Recorded r(dir.path());
  r.cache->put("abcd", bytes_of("object"));
  const std::string path = entry_file(*r.cache, "abcd");
  fs::remove(path);
  fs::create_directories(path + "/nested");
  write_all(path + "/nested/x.entry", "not an entry either");
  EXPECT_THAT(problem_of(*r.cache, path), HasSubstr("is not a regular file (a directory)"));
  EXPECT_EQ(r.cache->list().size(), 1u);  // the directory, not what is inside it
  EXPECT_EQ(r.cache->prune(uint64_t{1} << 30).size(), 1u);
  EXPECT_FALSE(fs::exists(path));
  // The same via clear().
  fs::create_directories(path + "/nested");
  r.cache->clear();
  EXPECT_FALSE(fs::exists(path));
}

// Before: temporary files were named <entry>.tmp.<pid>.<n> with n counting from 0 in each
// process, so a dead writer's leftover made the O_EXCL create fail in the process that got its
// pid, and that process ran memory-only.
TEST(CacheHostile, LeftoverTemporaryFileOfAReusedPidIsNoObstacle) {
  TempDir dir;
  Recorded r(dir.path());
  r.cache->put("abcd", bytes_of("first"));
  const std::string path = entry_file(*r.cache, "abcd");
  // Every name the old scheme could give this process's next writes (its counter is shared by
  // the tests before this one).
  for (int n = 0; n < 2048; ++n)
    write_all(path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(n), "dead");
  Recorded again(dir.path());
  again.cache->put("abcd", bytes_of("second"));
  EXPECT_FALSE(again.cache->degraded());
  EXPECT_TRUE(again.warnings->empty()) << ::testing::PrintToString(*again.warnings);
  std::vector<char> got;
  Recorded reader(dir.path());
  ASSERT_TRUE(reader.cache->get("abcd", &got));
  EXPECT_EQ(got, bytes_of("second"));
  // Fresh temporary files may be a live writer's: prune keeps them; stale ones it removes.
  EXPECT_EQ(again.cache->prune(uint64_t{1} << 30).size(), 0u);
  const std::string leftover = path + ".tmp." + std::to_string(::getpid()) + ".0";
  fs::last_write_time(leftover, fs::file_time_type::clock::now() - std::chrono::minutes(11));
  std::vector<CacheEntry> removed = again.cache->prune(uint64_t{1} << 30);
  ASSERT_EQ(removed.size(), 1u);
  EXPECT_EQ(removed[0].path, leftover);
}

class Umask {
 public:
  explicit Umask(mode_t mask) : old_(::umask(mask)) {}
  ~Umask() { ::umask(old_); }

 private:
  mode_t old_;
};

// Before: under umask 000 the cache made its directories 0777, then refused them as writable by
// all users: every process ran memory-only.
TEST(CacheHostile, UmaskZeroMakesNoDirectoryWritableByAll) {
  TempDir dir;
  const std::string cache_dir = dir.path() + "/parent/cache";
  Umask zero(0);
  Recorded r(cache_dir);
  r.cache->put("abcd", bytes_of("object"));
  EXPECT_FALSE(r.cache->degraded());
  EXPECT_TRUE(r.warnings->empty()) << ::testing::PrintToString(*r.warnings);
  const std::string path = entry_file(*r.cache, "abcd");
  ASSERT_FALSE(path.empty());
  for (const std::string& d : {dir.path() + "/parent", cache_dir, cache_dir + "/v1",
                               cache_dir + "/v1/locks", cache_dir + "/v1/ab"})
    EXPECT_EQ(mode_of(d) & S_IWOTH, 0u) << d << " mode " << std::oct << mode_of(d);
  EXPECT_EQ(mode_of(path) & S_IWOTH, 0u);
  std::vector<char> got;
  EXPECT_TRUE(Recorded(cache_dir).cache->get("abcd", &got));
}

// A shard another user could write to is not read or written (one warning with the fix), verify
// reports its entries, prune removes it, and the next write makes a good one.
TEST(CacheHostile, ShardWritableByAllIsNotUsed) {
  TempDir dir;
  Recorded seed(dir.path());
  seed.cache->put("abcd", bytes_of("object"));
  const std::string path = entry_file(*seed.cache, "abcd");
  const std::string shard = fs::path(path).parent_path();
  fs::permissions(shard, fs::perms::others_write, fs::perm_options::add);
  Recorded r(dir.path());
  std::vector<char> got;
  EXPECT_FALSE(r.cache->get("abcd", &got));
  EXPECT_FALSE(r.cache->get("abcd", &got));
  r.cache->put("abcd", bytes_of("other"));
  EXPECT_TRUE(r.cache->get("abcd", &got));  // kept in memory, not written there
  EXPECT_EQ(got, bytes_of("other"));
  EXPECT_EQ(r.cache->stats().writes, 0u);
  EXPECT_FALSE(r.cache->degraded());  // the other shards are used
  ASSERT_EQ(r.warnings->size(), 1u) << ::testing::PrintToString(*r.warnings);
  EXPECT_THAT((*r.warnings)[0], HasSubstr("shard " + shard + " is not used: " + shard +
                                          " is writable by all users (mode 0757)"));
  EXPECT_THAT((*r.warnings)[0], HasSubstr("fix: chmod o-w " + shard));
  EXPECT_THAT(problem_of(*r.cache, path), HasSubstr("its shard is not trusted"));
  r.cache->prune(uint64_t{1} << 30);
  EXPECT_FALSE(fs::exists(shard));
  Recorded after(dir.path());
  after.cache->put("abcd", bytes_of("third"));
  EXPECT_TRUE(after.cache->get("abcd", &got));
  EXPECT_EQ(after.cache->stats().writes, 1u);
}

TEST(CacheHostile, LocksDirectoryWritableByAllMakesTheCacheUnused) {
  TempDir dir;
  Recorded seed(dir.path());
  fs::permissions(dir.path() + "/v1/locks", fs::perms::others_write, fs::perm_options::add);
  Recorded r(dir.path());
  EXPECT_TRUE(r.cache->degraded());
  EXPECT_THAT(r.cache->unusable(), HasSubstr("v1/locks is writable by all users"));
  ASSERT_EQ(r.warnings->size(), 1u);
  EXPECT_THAT((*r.warnings)[0], HasSubstr("is not used"));
  EXPECT_THAT((*r.warnings)[0], HasSubstr("fix: chmod o-w " + dir.path() + "/v1/locks"));
  EXPECT_EQ(r.cache->lock("abcd"), nullptr);
}

// Before: every DiskCache of a process repeated the warning, and it named no fix.
TEST(CacheHostile, AnUnusableCacheWarnsOncePerProcessWithTheFix) {
  TempDir dir;
  fs::create_directories(dir.path());
  fs::permissions(dir.path(), fs::perms::others_write, fs::perm_options::add);
  ::testing::internal::CaptureStderr();
  for (int i = 0; i < 3; ++i) {
    EngineOptions eo;  // the default warning sink: stderr
    eo.cache_dir = dir.path();
    EXPECT_TRUE(DiskCache(engine_cache_options(dir.path())).degraded());
    Engine e(eo);
  }
  const std::string err = ::testing::internal::GetCapturedStderr();
  const std::string warning = "optfuse: warning: kernel cache " + dir.path() +
                              " is not used: " + dir.path() + " is writable by all users";
  EXPECT_THAT(err, HasSubstr(warning));
  EXPECT_THAT(err, HasSubstr("fix: chmod o-w " + dir.path()));
  EXPECT_EQ(err.find(warning), err.rfind(warning)) << err;
}

// An entry file writable by all users could have been rewritten by anyone, a symlink could point
// anywhere: both are invalid entries (removed, recompiled), whatever they hold.
TEST(CacheHostile, EntryFileWritableByAllIsInvalid) {
  TempDir dir;
  expect_recovers(
      dir.path(), "mode 0666", [](const std::string& p) { fs::permissions(p, fs::perms(0666)); },
      "is writable by all users (mode 0666)");
}

TEST(CacheHostile, SymlinkInPlaceOfAnEntryIsInvalid) {
  TempDir dir, elsewhere;
  fs::create_directories(elsewhere.path());
  const std::string target = elsewhere.path() + "/real.entry";
  expect_recovers(
      dir.path(), "symlink",
      [&](const std::string& p) {
        fs::rename(p, target);
        fs::create_symlink(target, p);
      },
      "is a symbolic link");
  EXPECT_TRUE(fs::exists(target));  // the link was removed, not what it pointed to
}

// Ownership: only root can give a file away, so these run as root (as CI does).
TEST(CacheHostile, EntryOrShardOwnedByAnotherUserIsNotUsed) {
  if (::geteuid() != 0) GTEST_SKIP() << "chown needs root";
  TempDir dir;
  expect_recovers(
      dir.path(), "entry owned by nobody",
      [](const std::string& p) { ASSERT_EQ(::chown(p.c_str(), kNobody, kNobody), 0); },
      "is owned by uid 65534, not this user");
  Recorded seed(dir.path());
  seed.cache->put("abcd", bytes_of("object"));
  const std::string shard = fs::path(entry_file(*seed.cache, "abcd")).parent_path();
  ASSERT_EQ(::chown(shard.c_str(), kNobody, kNobody), 0);
  Recorded r(dir.path());
  std::vector<char> got;
  EXPECT_FALSE(r.cache->get("abcd", &got));
  ASSERT_EQ(r.warnings->size(), 1u);
  EXPECT_THAT((*r.warnings)[0], HasSubstr(shard + " is owned by uid 65534"));
}

// sgd()'s kernel object taken from a cache of its own; momentum()'s likewise.
std::vector<char> kernel_object(const Graph& g) {
  TempDir dir;
  Recorded r(dir.path());
  Engine e;
  e.set_object_store(r.cache);
  e.kernel(g);
  return read_entry(entry_file(*r.cache, e.kernel_key(g))).object;
}

// The entry at `path` with `object` in place of its own, every checksum computed anew: it passes
// every check of a read (the object is an ELF object of this machine carrying the target's text)
// and only linking it can tell.
void forge(const std::string& path, const std::vector<char>& object) {
  Entry e = read_entry(path);
  e.object = object;
  write_entry(path, e);
}

// `object` with the name of a symbol it references (a Halide runtime function) changed, so that
// nothing defines it.
std::vector<char> with_unresolvable_symbol(std::vector<char> object) {
  std::string text(object.begin(), object.end());
  size_t at = text.find(std::string("halide_do_par_for") + '\0');
  EXPECT_NE(at, std::string::npos);
  if (at != std::string::npos) object[at + 16] = 'x';  // halide_do_par_fox
  return object;
}

// Before: another kernel's object under this key (its symbols name its own key), or one whose
// runtime reference resolves nowhere, failed every load with an Error, and verify reported the
// cache clean.
TEST(CacheHostile, ForgedEntryThatDoesNotLinkIsRecompiled) {
  TempDir dir;
  const std::vector<char> other = kernel_object(momentum());
  expect_recovers(
      dir.path(), "another kernel's object", [&](const std::string& p) { forge(p, other); },
      "it does not link");
  expect_recovers(
      dir.path(), "an unresolvable symbol",
      [&](const std::string& p) { forge(p, with_unresolvable_symbol(read_entry(p).object)); },
      "halide_do_par_fox");
}

TEST(CacheHostile, VerifyLinksEveryEntry) {
  TempDir dir;
  Recorded r(dir.path());
  Engine e;
  e.set_object_store(r.cache);
  e.kernel(sgd());
  e.kernel(momentum());
  for (const CacheEntry& c : r.cache->list(true)) EXPECT_EQ(c.problem, "") << c.path;
  const std::string sgd_path = entry_file(*r.cache, e.kernel_key(sgd()));
  const std::string momentum_path = entry_file(*r.cache, e.kernel_key(momentum()));
  forge(sgd_path, read_entry(momentum_path).object);
  forge(momentum_path, with_unresolvable_symbol(read_entry(momentum_path).object));
  EXPECT_THAT(problem_of(*r.cache, sgd_path), HasSubstr("does not link"));
  EXPECT_THAT(problem_of(*r.cache, sgd_path), HasSubstr("optfuse_" + e.kernel_key(sgd())));
  EXPECT_THAT(problem_of(*r.cache, momentum_path), HasSubstr("halide_do_par_fox"));
  // Without a linker (a cache opened only to list) the forgeries pass: the checksums hold.
  DiskCache plain({dir.path()});
  for (const CacheEntry& c : plain.list(true)) EXPECT_EQ(c.problem, "") << c.path;
}

// The runtime's entry is linked before any kernel: a forged one is discarded and compiled.
TEST(CacheHostile, ForgedRuntimeThatDoesNotLinkIsRecompiled) {
  TempDir dir;
  std::string runtime_path;
  {
    Recorded first(dir.path());
    Engine a;
    a.set_object_store(first.cache);
    a.kernel(sgd());
    for (const CacheEntry& c : first.cache->list())
      if (c.kind == "runtime") runtime_path = c.path;
  }
  ASSERT_FALSE(runtime_path.empty());
  forge(runtime_path, kernel_object(momentum()));  // links, but lacks every runtime function
  Recorded second(dir.path());
  EXPECT_THAT(problem_of(*second.cache, runtime_path), HasSubstr("does not link"));
  Engine b;
  b.set_object_store(second.cache);
  check_runs(*b.kernel(sgd()));
  EXPECT_EQ(b.counters().compiles, 0);  // the kernel's entry was good
  ASSERT_EQ(second.warnings->size(), 1u) << ::testing::PrintToString(*second.warnings);
  EXPECT_THAT((*second.warnings)[0], HasSubstr(runtime_path));
  EXPECT_EQ(problem_of(*second.cache, runtime_path), "");  // rewritten
}

}  // namespace
}  // namespace optfuse
