#pragma once
// What the disk cache tests share (tests/test_cache.cpp, tests/test_cache_objects.cpp): a scratch
// directory, a DiskCache that records its warnings, entry files, and the corrupt-then-recover
// check.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cache/entry.h"
#include "optfuse/cache.h"
#include "optfuse/engine.h"
#include "optfuse/graph.h"

namespace optfuse::testing {

// p' = p - lr * g: the kernel every cache test stores, loads and runs.
Graph sgd(const std::string& name = "sgd");

// A fresh directory per test, removed afterwards.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }

 private:
  static inline int counter_ = 0;
  std::string path_;
};

// A DiskCache that records its warnings.
struct Recorded {
  std::shared_ptr<std::vector<std::string>> warnings = std::make_shared<std::vector<std::string>>();
  std::shared_ptr<DiskCache> cache;
  explicit Recorded(const std::string& dir, uint64_t max_bytes = uint64_t{1} << 30);
};

std::vector<char> bytes_of(const std::string& s);
std::string read_all(const std::string& path);
void write_all(const std::string& path, const std::string& s);
// The file of `key`'s entry in `c`, or "".
std::string entry_file(const DiskCache& c, const std::string& key);
// An entry's metadata and object, read through the format's own decoder (a test failure if the
// file is not a valid entry).
struct Entry {
  cache::Metadata m;
  std::vector<char> object;
};
Entry read_entry(const std::string& path);
// Writes `e` with its object's size and checksum and the entry checksum computed anew: what a
// tool that knows the format writes, so that only the checks past the checksums are left.
void write_entry(const std::string& path, Entry e);

// Runs sgd()'s kernel `k` and compares it with the interpreter.
void check_runs(const Kernel& k);

// Each corruption: one warning naming the file (and `why`), a miss, a recompile, and a good entry
// again.
void expect_recovers(const std::string& dir, const std::string& what,
                     const std::function<void(const std::string& path)>& corrupt,
                     const std::string& why = "");

}  // namespace optfuse::testing
