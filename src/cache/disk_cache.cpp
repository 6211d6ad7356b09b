// DiskCache: entries are whole files replaced atomically; every read is checked against the key,
// the caller's signature, the entry's checksums and the object's own ELF header (src/cache/entry.h;
// the object check comes from the engine, CacheOptions::check_object) before a byte is returned.
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "cache/entry.h"
#include "cache/fs.h"
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

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

double mtime_seconds(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return 0;
  return static_cast<double>(st.st_mtim.tv_sec) + st.st_mtim.tv_nsec * 1e-9;
}

bool is_entry(const fs::path& p) { return p.extension() == ".entry"; }
bool is_temporary(const fs::path& p) {
  return p.filename().string().find(".tmp.") != std::string::npos;
}

// What is wrong with entry `m` read from `path` for `key` and `info` ("" if nothing).
std::string mismatch(const cache::Metadata& m, const std::string& key, const ObjectInfo* info) {
  if (m.key != key) return "it holds key " + m.key + " (a misplaced or swapped file)";
  if (!info) return "";
  if (!info->kind.empty() && m.kind != info->kind)
    return "it holds a " + m.kind + ", expected a " + info->kind;
  if (!info->target.empty() && m.target != info->target)
    return "it is for target " + m.target + ", expected " + info->target;
  if (!info->signature.empty() &&
      m.signature_xxh3 != cache::hash_hex(info->signature.data(), info->signature.size()))
    return "its kernel signature does not match the kernel's";
  return "";
}

}  // namespace

DiskCache::DiskCache(CacheOptions options) : options_(std::move(options)) {
  if (options_.dir.empty()) throw Error("DiskCache needs a directory");
  root_ = (fs::path(options_.dir) / "v1").string();
  std::string error;
  if (!cache::make_dirs(root_ + "/locks", &error)) {
    degrade(error);
    return;
  }
  // The entries are native code this process runs: a directory another user can write to could
  // hand it theirs (cache/README.md, "Trust"). Such a cache is not read or written at all.
  for (const std::string& d : {options_.dir, root_}) {
    if (std::string why = cache::untrusted_directory(d); !why.empty()) {
      untrusted_ = true;
      degraded_ = counters_.degraded = true;
      warn("kernel cache " + options_.dir + " is not used: " + why + " (it holds code this " +
           "process would run); compiled kernels are kept in memory only");
      return;
    }
  }
}

DiskCache::~DiskCache() = default;

void DiskCache::warn(const std::string& message) const {
  if (options_.warn) {
    options_.warn(message);
  } else {
    std::fprintf(stderr, "optfuse: warning: %s\n", message.c_str());
  }
}

void DiskCache::degrade(const std::string& why) {
  if (degraded_) return;
  degraded_ = true;
  counters_.degraded = true;
  warn("kernel cache " + options_.dir + " is not writable (" + why +
       "); compiled kernels are kept in memory only");
}

bool DiskCache::degraded() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return degraded_;
}

std::string DiskCache::entry_path(const std::string& key) const {
  return root_ + "/" + key.substr(0, 2) + "/" + key + ".entry";
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
  if (auto it = memory_.find(key); it != memory_.end()) {
    *object = it->second;
    ++counters_.hits;
    return true;
  }
  if (untrusted_) {
    ++counters_.misses;
    return false;
  }
  std::string path = entry_path(key);
  std::vector<char> bytes;
  std::string error;
  std::string problem;
  if (!cache::read_file(path, &bytes, &error)) {
    if (errno != EINVAL) {  // (EINVAL: not a regular file, an invalid entry below)
      if (errno != ENOENT) warn("cannot read kernel cache entry: " + error);
      ++counters_.misses;
      return false;
    }
    problem = "not a regular file";
  }
  cache::Metadata m;
  std::vector<char> obj;
  bool older_format = false;
  if (problem.empty()) problem = cache::decode(bytes, &m, &obj, options_, true, &older_format);
  if (problem.empty()) problem = mismatch(m, key, &info);
  if (!problem.empty()) {
    // An earlier format's entry is what an upgrade leaves, not a fault: replaced without a word.
    if (!older_format)
      warn("kernel cache entry " + path + " is invalid: " + problem + "; recompiling");
    std::error_code ec;
    fs::remove(path, ec);
    ++counters_.rejected;
    ++counters_.misses;
    return false;
  }
  cache::touch(path);
  *object = std::move(obj);
  ++counters_.hits;
  return true;
}

void DiskCache::put(const std::string& key, const ObjectInfo& info,
                    const std::vector<char>& object) {
  check_key(key);
  std::lock_guard<std::mutex> lock(mutex_);
  if (!degraded_) {
    std::string path = entry_path(key), error;
    if (cache::make_dirs(fs::path(path).parent_path().string(), &error) &&
        cache::atomic_write(
            path,
            cache::encode(cache::make_metadata(key, info, object, options_.toolchain), object),
            &error)) {
      ++counters_.writes;
      uint64_t total = 0;
      std::vector<CacheEntry> all = list_locked(false, &total);
      for (size_t i = 0; total > options_.max_bytes && i < all.size(); ++i) {
        if (all[i].key == key) continue;  // never the entry just written
        std::error_code ec;
        if (fs::remove(all[i].path, ec)) {
          total -= all[i].file_bytes;
          ++counters_.evictions;
        }
      }
      return;
    }
    degrade(error);
  }
  memory_[key] = object;
}

std::shared_ptr<void> DiskCache::lock(const std::string& key) {
  check_key(key);
  if (degraded()) return nullptr;
  return cache::lock_file(root_ + "/locks/" + key + ".lock", options_.lock_timeout_s);
}

std::vector<CacheEntry> DiskCache::list_locked(bool verify, uint64_t* total) const {
  std::vector<CacheEntry> entries;
  std::error_code ec;
  *total = 0;
  for (fs::recursive_directory_iterator it(root_, ec), end; !ec && it != end; it.increment(ec)) {
    if (!it->is_regular_file(ec) || !is_entry(it->path())) continue;
    CacheEntry e;
    e.path = it->path().string();
    e.key = it->path().stem().string();
    e.file_bytes = it->file_size(ec);
    e.last_used = mtime_seconds(e.path);
    std::vector<char> bytes;
    std::string error;
    cache::Metadata m;
    // Listing needs the metadata line only (it is well under 64 KiB); verifying needs it all.
    if (!cache::read_file(e.path, &bytes, &error, verify ? static_cast<size_t>(-1) : 65536)) {
      e.problem = error;
    } else {
      e.problem = cache::decode(bytes, &m, nullptr, options_, verify);
      if (e.problem.empty()) e.problem = mismatch(m, e.key, nullptr);
      e.kind = m.kind;
      e.name = m.name;
      e.target = m.target;
      e.object_bytes = m.object_bytes;
      e.created = m.created;
    }
    *total += e.file_bytes;
    entries.push_back(std::move(e));
  }
  std::sort(entries.begin(), entries.end(), [](const CacheEntry& a, const CacheEntry& b) {
    return a.last_used != b.last_used ? a.last_used < b.last_used : a.key < b.key;
  });
  return entries;
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
  std::error_code ec;
  // Temporary files older than an hour belong to writers that died.
  double stale = now_seconds() - 3600;
  for (fs::recursive_directory_iterator it(root_, ec), end; !ec && it != end; it.increment(ec))
    if (it->is_regular_file(ec) && is_temporary(it->path()) &&
        mtime_seconds(it->path().string()) < stale) {
      CacheEntry e;
      e.path = it->path().string();
      e.problem = "stale temporary file";
      removed.push_back(e);
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
  for (const CacheEntry& e : removed) fs::remove(e.path, ec);
  return removed;
}

void DiskCache::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::error_code ec;
  for (fs::directory_iterator it(root_, ec), end; !ec && it != end; it.increment(ec))
    if (it->path().filename() != "locks") fs::remove_all(it->path(), ec);
  memory_.clear();
}

}  // namespace optfuse
