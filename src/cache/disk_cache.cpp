// DiskCache: entries are whole files replaced atomically; every read is checked against the key,
// the caller's signature, the entry's checksums and the object's own ELF header (src/cache/entry.h;
// the object check comes from the engine, CacheOptions::check_object) before a byte is returned.
// Listing and maintenance: maintenance.cpp.
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <set>

#include "cache/entry.h"
#include "cache/fs.h"
#include "cache/tree.h"
#include "optfuse/cache.h"
#include "optfuse/error.h"

namespace optfuse {
namespace fs = std::filesystem;

namespace {

void check_key(const std::string& key) {
  bool ok = !key.empty() && key.size() <= 128;
  for (char c : key)
    ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_');
  if (!ok) throw Error("cache key '" + key + "' must be 1-128 letters, digits, '-' or '_'");
}

// Prints a warning to stderr once per process: each message names its directory, so every
// engine of a process that opens one unusable cache adds nothing after the first.
void print_once(const std::string& message) {
  static std::mutex mutex;
  static std::set<std::string> printed;
  std::lock_guard<std::mutex> lock(mutex);
  if (printed.insert(message).second)
    std::fprintf(stderr, "optfuse: warning: %s\n", message.c_str());
}

// Whatever sits at `path` that is not a file (a directory an entry's name): a rename onto it
// would fail, and with it every later write.
void remove_non_file(const std::string& path) {
  struct stat st {};
  std::error_code ec;
  if (::lstat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) fs::remove_all(path, ec);
}

}  // namespace

namespace cache {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

double mtime_seconds(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return 0;
  return static_cast<double>(st.st_mtim.tv_sec) + st.st_mtim.tv_nsec * 1e-9;
}

std::string not_used_message(const std::string& dir, const std::string& why,
                             const std::string& fix) {
  return "kernel cache " + dir + " is not used: " + why +
         " (it holds code this process would run); compiled kernels are kept in memory only; "
         "fix: " +
         fix;
}

}  // namespace cache

DiskCache::DiskCache(CacheOptions options) : options_(std::move(options)) {
  if (options_.dir.empty()) throw Error("DiskCache needs a directory");
  root_ = (fs::path(options_.dir) / "v1").string();
  std::string error;
  // Checked even when the directories cannot be created: a read-only cache is still read.
  if (options_.create && !cache::make_dirs(cache::locks_of(root_), &error)) degrade(error);
  check_trust();
}

DiskCache::~DiskCache() = default;

// The entries are native code this process runs: a directory another user can write to could
// hand it theirs (cache/README.md, "Trust"). Such a cache is not read or written at all.
void DiskCache::check_trust() {
  for (const std::string& d : {options_.dir, root_, cache::locks_of(root_)}) {
    cache::Distrust t = cache::untrusted_directory(d);
    if (t.empty()) continue;
    unusable_ = t.why + "; fix: " + t.fix;
    degraded_ = counters_.degraded = true;
    warn(cache::not_used_message(options_.dir, t.why, t.fix));
    return;
  }
}

void DiskCache::warn(const std::string& message) const {
  if (options_.warn) {
    options_.warn(message);
  } else {
    print_once(message);
  }
}

void DiskCache::degrade(const std::string& why) {
  if (degraded_) return;
  degraded_ = true;
  counters_.degraded = true;
  warn("kernel cache " + options_.dir + " is not writable (" + why +
       "); compiled kernels are kept in memory only; fix: make " + options_.dir +
       " writable (or free space on its disk), or use another directory (--cache-dir, or "
       "OPTFUSE_CACHE_DIR)");
}

bool DiskCache::degraded() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return degraded_;
}

std::string DiskCache::unusable() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return unusable_;
}

std::string DiskCache::entry_path(const std::string& key) const {
  return cache::entry_of(root_, key);
}

// A shard another user could write to is skipped (its entries are misses, nothing is written
// there), with one warning; `optfuse cache prune` removes it.
bool DiskCache::shard_trusted_locked(const std::string& shard) {
  cache::Distrust t = cache::untrusted_directory(shard);
  if (t.empty()) return true;
  if (untrusted_shards_.insert(shard).second)
    warn("kernel cache shard " + shard + " is not used: " + t.why +
         " (it would hold code this process runs); its kernels are compiled and kept in memory; "
         "fix: " +
         t.fix + ", or remove it (optfuse cache prune does)");
  return false;
}

void DiskCache::reject_locked(const std::string& path, const std::string& problem, bool quietly) {
  if (!quietly) warn("kernel cache entry " + path + " is invalid: " + problem + "; recompiling");
  std::error_code ec;
  fs::remove_all(path, ec);  // (a symlink is removed, not followed)
  ++counters_.rejected;
}

bool DiskCache::get(const std::string& key, std::vector<char>* object) {
  return get(key, ObjectInfo{}, object);
}

void DiskCache::put(const std::string& key, const std::vector<char>& object) {
  put(key, ObjectInfo{}, object);
}

bool DiskCache::get(const std::string& key, const ObjectInfo& info, std::vector<char>* object) {
  check_key(key);
  std::lock_guard<std::mutex> lock(mutex_);
  bool hit = false;
  if (auto it = memory_.find(key); it != memory_.end()) {
    *object = it->second;
    hit = true;
  } else if (unusable_.empty() && shard_trusted_locked(cache::shard_of(root_, key))) {
    hit = read_locked(key, info, object);
  }
  ++(hit ? counters_.hits : counters_.misses);
  return hit;
}

bool DiskCache::read_locked(const std::string& key, const ObjectInfo& info,
                            std::vector<char>* object) {
  std::string path = entry_path(key), error;
  std::vector<char> bytes;
  cache::ReadOptions read{kMaxEntryBytes, /*prefix=*/false, /*entry=*/true};
  switch (cache::read_file(path, &bytes, &error, read)) {
    case cache::ReadStatus::kAbsent:
      return false;
    case cache::ReadStatus::kError:
      warn("cannot read kernel cache entry: " + error);
      return false;
    case cache::ReadStatus::kInvalid:  // too large, not a file, not trusted
      reject_locked(path, error, false);
      return false;
    case cache::ReadStatus::kOk:
      break;
  }
  cache::Metadata m;
  std::vector<char> obj;
  bool older_format = false;
  std::string problem = cache::decode(bytes, &m, &obj, options_, true, &older_format);
  if (problem.empty()) problem = cache::mismatch(m, key, &info);
  if (!problem.empty()) {
    // An earlier format's entry is what an upgrade leaves, not a fault: replaced without a word.
    reject_locked(path, problem, older_format);
    return false;
  }
  cache::touch(path);
  *object = std::move(obj);
  return true;
}

void DiskCache::put(const std::string& key, const ObjectInfo& info,
                    const std::vector<char>& object) {
  check_key(key);
  std::lock_guard<std::mutex> lock(mutex_);
  std::string shard = cache::shard_of(root_, key), error;
  // An object too large to be read back (no compiler makes one) is kept in memory.
  if (degraded_ || object.size() > kMaxEntryBytes) {
    memory_[key] = object;
    return;
  }
  if (!cache::make_dirs(shard, &error)) {
    degrade(error);
    memory_[key] = object;
    return;
  }
  if (!shard_trusted_locked(shard)) {
    memory_[key] = object;
    return;
  }
  std::string path = entry_path(key);
  remove_non_file(path);
  if (!cache::atomic_write(
          path, cache::encode(cache::make_metadata(key, info, object, options_.toolchain), object),
          &error)) {
    degrade(error);
    memory_[key] = object;
    return;
  }
  ++counters_.writes;
  evict_locked(key);
}

// Invalid entries first, then the least recently used, until the total fits; never `keep_key`,
// the entry just written.
void DiskCache::evict_locked(const std::string& keep_key) {
  uint64_t total = 0;
  std::vector<CacheEntry> all = list_locked(false, &total);
  std::stable_partition(all.begin(), all.end(),
                        [](const CacheEntry& e) { return !e.problem.empty(); });
  for (size_t i = 0; total > options_.max_bytes && i < all.size(); ++i) {
    if (all[i].key == keep_key) continue;
    std::error_code ec;
    if (fs::remove_all(all[i].path, ec) > 0) {
      total -= all[i].file_bytes;
      ++counters_.evictions;
    }
  }
}

std::shared_ptr<void> DiskCache::lock(const std::string& key) {
  check_key(key);
  if (degraded()) return nullptr;
  return cache::lock_file(cache::locks_of(root_) + "/" + key + ".lock", options_.lock_timeout_s);
}

void DiskCache::discard(const std::string& key, const std::string& why) {
  check_key(key);
  std::lock_guard<std::mutex> lock(mutex_);
  memory_.erase(key);
  if (!unusable_.empty()) return;
  std::string path = entry_path(key);
  std::error_code ec;
  if (fs::symlink_status(path, ec).type() != fs::file_type::not_found)
    reject_locked(path, why, false);
}

}  // namespace optfuse
