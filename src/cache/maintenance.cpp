// DiskCache's listing and maintenance: list (and verify), stats, prune, clear. Everything under
// an entry's name is listed, a directory or a FIFO too, so that verify reports it and prune
// removes it.
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>

#include "cache/entry.h"
#include "cache/fs.h"
#include "cache/tree.h"
#include "optfuse/cache.h"

namespace optfuse {
namespace fs = std::filesystem;

namespace {

// The shards of `root` (every directory in it but locks/), in name order.
std::vector<std::string> shards(const std::string& root) {
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec))
    if (it->is_directory(ec) && it->path().filename() != "locks") out.push_back(it->path());
  std::sort(out.begin(), out.end());
  return out;
}

// The names in directory `dir`, in name order.
std::vector<std::string> names_in(const std::string& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    out.push_back(it->path().filename());
  std::sort(out.begin(), out.end());
  return out;
}

// The entry at `path` as listed: its size and last use, and what is wrong with it when its
// shard is not trusted or it cannot be read as an entry. `verify`: read whole and checked.
CacheEntry read_listed(const std::string& path, const cache::Distrust& shard, bool verify,
                       const CacheOptions& options) {
  CacheEntry e;
  e.path = path;
  std::string name = fs::path(path).filename();
  e.key = name.substr(0, name.size() - 6);  // (without ".entry")
  struct stat st {};
  if (::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode))
    e.file_bytes = static_cast<uint64_t>(st.st_size);
  e.last_used = cache::mtime_seconds(path);
  if (!shard.empty()) {
    e.problem = "its shard is not trusted: " + shard.why;
    return e;
  }
  std::vector<char> bytes;
  std::string error;
  // Listing needs the metadata line only (it is well under 64 KiB); verifying needs it all.
  cache::ReadOptions read{verify ? kMaxEntryBytes : 65536, /*prefix=*/!verify, /*entry=*/true};
  if (cache::read_file(path, &bytes, &error, read) != cache::ReadStatus::kOk) {
    e.problem = error;
    return e;
  }
  cache::Metadata m;
  e.problem = cache::decode(bytes, &m, nullptr, options, verify);
  if (e.problem.empty()) e.problem = cache::mismatch(m, e.key, nullptr);
  e.kind = m.kind;
  e.name = m.name;
  e.target = m.target;
  e.object_bytes = m.object_bytes;
  e.created = m.created;
  return e;
}

}  // namespace

std::vector<CacheEntry> DiskCache::list_locked(bool verify, uint64_t* total) const {
  std::vector<CacheEntry> entries;
  *total = 0;
  for (const std::string& shard : shards(root_)) {
    cache::Distrust trust = cache::untrusted_directory(shard);
    for (const std::string& name : names_in(shard)) {
      if (!cache::is_entry_name(name)) continue;
      entries.push_back(read_listed(shard + "/" + name, trust, verify, options_));
      *total += entries.back().file_bytes;
    }
  }
  std::sort(entries.begin(), entries.end(), [](const CacheEntry& a, const CacheEntry& b) {
    return a.last_used != b.last_used ? a.last_used < b.last_used : a.key < b.key;
  });
  if (verify && options_.linker) link_check_locked(&entries);
  return entries;
}

// Every valid entry linked as a load would link it: each target's runtime first, so that its
// kernels link against the runtime the cache holds.
void DiskCache::link_check_locked(std::vector<CacheEntry>* entries) const {
  std::unique_ptr<ObjectLinker> linker = options_.linker();
  std::vector<CacheEntry*> order;
  for (CacheEntry& e : *entries)
    if (e.problem.empty()) order.push_back(&e);
  std::stable_partition(order.begin(), order.end(),
                        [](const CacheEntry* e) { return e->kind == "runtime"; });
  for (CacheEntry* e : order) {
    std::vector<char> bytes, object;
    std::string error;
    cache::Metadata m;
    cache::ReadOptions read{kMaxEntryBytes, /*prefix=*/false, /*entry=*/true};
    if (cache::read_file(e->path, &bytes, &error, read) != cache::ReadStatus::kOk) {
      e->problem = error;  // (changed since it was read)
      continue;
    }
    e->problem = cache::decode(bytes, &m, &object, options_);
    if (e->problem.empty()) e->problem = linker->link_problem(m.kind, m.target, e->key, object);
  }
}

std::vector<CacheEntry> DiskCache::list(bool verify) const {
  std::lock_guard<std::mutex> lock(mutex_);
  uint64_t total = 0;
  return list_locked(verify, &total);
}

CacheStats DiskCache::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  CacheStats s = counters_;
  s.dir = options_.dir;
  s.max_bytes = options_.max_bytes;
  for (const CacheEntry& e : list_locked(false, &s.bytes)) {
    ++s.entries;
    if (e.kind == "kernel") ++s.kernels;
    if (e.kind == "runtime") ++s.runtimes;
  }
  return s;
}

std::vector<CacheEntry> DiskCache::prune(uint64_t max_bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<CacheEntry> removed;
  std::vector<CacheEntry> untrusted_shards;
  const double stale = cache::now_seconds() - kStaleTemporarySeconds;
  for (const std::string& shard : shards(root_)) {
    if (cache::Distrust t = cache::untrusted_directory(shard); !t.empty()) {
      CacheEntry e;
      e.path = shard;
      e.problem = "shard not trusted: " + t.why;
      untrusted_shards.push_back(e);
    }
    for (const std::string& name : names_in(shard))
      if (cache::is_temporary_name(name) && cache::mtime_seconds(shard + "/" + name) < stale) {
        CacheEntry e;
        e.path = shard + "/" + name;
        e.problem = "stale temporary file";
        removed.push_back(e);
      }
  }
  uint64_t total = 0;
  std::vector<CacheEntry> all = list_locked(/*verify=*/true, &total);
  for (const CacheEntry& e : all)
    if (!e.problem.empty()) {
      removed.push_back(e);
      total -= e.file_bytes;
    }
  for (const CacheEntry& e : all)
    if (e.problem.empty() && total > max_bytes) {
      removed.push_back(e);
      total -= e.file_bytes;
      ++counters_.evictions;
    }
  removed.insert(removed.end(), untrusted_shards.begin(), untrusted_shards.end());
  std::error_code ec;
  for (const CacheEntry& e : removed) fs::remove_all(e.path, ec);  // (symlinks not followed)
  return removed;
}

size_t DiskCache::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::error_code ec;
  for (const std::string& name : names_in(root_))
    if (name != "locks") fs::remove_all(root_ + "/" + name, ec);
  size_t kept = 0;
  const std::string locks = cache::locks_of(root_);
  for (const std::string& name : names_in(locks))
    if (!cache::remove_unheld_lock(locks + "/" + name)) ++kept;
  memory_.clear();
  return kept;
}

}  // namespace optfuse
