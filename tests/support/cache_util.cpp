#include "support/cache_util.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>

#include "support/gen.h"
#include "support/run_kernel.h"

namespace optfuse::testing {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

Graph sgd(const std::string& name) {
  Graph g(name);
  Value p = g.param("p"), grad = g.grad("g"), lr = g.scalar("lr");
  g.output("p", p - lr * grad);
  return g;
}

TempDir::TempDir() {
  path_ = (fs::temp_directory_path() /
           ("optfuse-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter_++)))
              .string();
  fs::remove_all(path_);
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::permissions(path_, fs::perms::owner_all, fs::perm_options::add, ec);
  fs::remove_all(path_, ec);
}

Recorded::Recorded(const std::string& dir, uint64_t max_bytes) {
  CacheOptions o = engine_cache_options(dir);
  o.max_bytes = max_bytes;
  auto w = warnings;
  o.warn = [w](const std::string& m) { w->push_back(m); };
  cache = std::make_shared<DiskCache>(o);
}

std::vector<char> bytes_of(const std::string& s) { return std::vector<char>(s.begin(), s.end()); }

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_all(const std::string& path, const std::string& s) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << s;
}

std::string entry_file(const DiskCache& c, const std::string& key) {
  for (const CacheEntry& e : c.list())
    if (e.key == key) return e.path;
  return "";
}

Entry read_entry(const std::string& path) {
  std::string s = read_all(path);
  Entry e;
  EXPECT_EQ(cache::decode(std::vector<char>(s.begin(), s.end()), &e.m, &e.object, CacheOptions{}),
            "")
      << path;
  return e;
}

void write_entry(const std::string& path, Entry e) {
  e.m.object_bytes = e.object.size();
  e.m.object_xxh3 = cache::hash_hex(e.object.data(), e.object.size());
  std::vector<char> bytes = cache::encode(e.m, e.object);
  write_all(path, std::string(bytes.begin(), bytes.end()));
}

void check_runs(const Kernel& k) {
  Tensors in;
  for (size_t i = 0; i < 333; ++i) {
    in["p"].push_back(gen(1, i));
    in["g"].push_back(gen(2, i));
  }
  expect_close(run_kernel(k, in, {{"lr", 0.5}}), interpret(sgd(), in, {{"lr", 0.5}}), 1e-7);
}

void expect_recovers(const std::string& dir, const std::string& what,
                     const std::function<void(const std::string& path)>& corrupt,
                     const std::string& why) {
  SCOPED_TRACE(what);
  Recorded first(dir);
  Engine a;
  a.set_object_store(first.cache);
  std::string key = a.kernel_key(sgd());
  a.kernel(sgd());
  std::string path = entry_file(*first.cache, key);
  ASSERT_FALSE(path.empty());
  corrupt(path);

  Recorded second(dir);
  Engine b;
  b.set_object_store(second.cache);
  auto k = b.kernel(sgd());
  EXPECT_EQ(b.counters().compiles, 1);
  ASSERT_EQ(second.warnings->size(), 1u) << ::testing::PrintToString(*second.warnings);
  EXPECT_THAT((*second.warnings)[0], HasSubstr(path));
  EXPECT_THAT((*second.warnings)[0], HasSubstr(why));
  check_runs(*k);
  EXPECT_EQ(second.cache->stats().rejected, 1u);
  for (const CacheEntry& e : second.cache->list(true)) EXPECT_EQ(e.problem, "") << e.path;
  EXPECT_FALSE(entry_file(*second.cache, key).empty());  // rewritten
}

}  // namespace optfuse::testing
