#pragma once
// DiskCache: a persistent, content-addressed store of compiled objects (kernels and the Halide
// runtime of each target), shared by every process that points at the same directory.
//
//   optfuse::Engine engine;   // memory -> disk (default_cache_dir()) -> compile
//   optfuse::EngineOptions eo;
//   eo.cache_dir = "/scratch/kernels";   // another directory; eo.memory_only = true: none
//
// Contracts (format in cache/README.md):
// - An entry is ONE file, `<dir>/v1/<key[0:2]>/<key>.entry`: a metadata record (JSON: the full
//   key, kind, target, signature hash, versions, object size and XXH3-128 checksum, times), an
//   XXH3-128 checksum over that header and the object, then the object bytes. It is written to a
//   temporary file, fsync'ed and renamed, so a reader never sees a torn entry.
// - get() returns bytes only if the magic, format, key, versions, kind, target, signature (when
//   the caller gives them), size and both checksums match, and the object is an ELF relocatable
//   object of the target's architecture carrying (for a kernel) the target Halide compiled it
//   for; anything else is a miss with one warning, and the bad file is removed so the next put()
//   rewrites it (an entry of an earlier format is replaced the same way, without a warning).
//   Nothing read from the cache can crash the process.
// - A directory that cannot be created or written (read-only, disk full) degrades this cache to
//   memory with one warning; reads from a read-only directory still work.
// - A directory every user can write to, or one owned by another user (root excepted), is not
//   used at all, with one warning: its entries are native code this process would run.
// - lock(key) takes an flock on `<dir>/v1/locks/<key>.lock` (waiting at most lock_timeout_s): a
//   dead holder's lock is released by the kernel, so there is never a deadlock.
// - The total size is kept under max_bytes by evicting least-recently-used entries (a hit touches
//   the entry's modification time).
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "optfuse/object_store.h"

namespace optfuse {

// `--cache-dir` resolution without the flag: $OPTFUSE_CACHE_DIR, else $XDG_CACHE_HOME/optfuse,
// else $HOME/.cache/optfuse (else ./.optfuse-cache if HOME is unset).
std::string default_cache_dir();

// "1G", "512M", "64k", "1000" (bytes) -> bytes; throws Error naming `text` otherwise.
uint64_t parse_size(const std::string& text);

struct CacheOptions {
  std::string dir;                         // required
  uint64_t max_bytes = uint64_t{1} << 30;  // LRU cap, 1 GiB
  double lock_timeout_s = 120;             // how long lock() waits for another compiler
  // Receives each warning (default: "optfuse: warning: ..." on stderr).
  std::function<void(const std::string&)> warn;
  // What makes an entry usable by this process, from the compiler's side (the cache knows nothing
  // of the compiler; engine_cache_options(), engine.h, fills both as an engine does): entries
  // written with another `toolchain` are misses, and `check_object` says what is wrong with an
  // object ("" if nothing) before get() returns it. Empty / unset: not checked, e.g. a cache
  // opened only to list, prune or clear.
  std::string toolchain;
  std::function<std::string(const std::string& kind, const std::string& target, const char* data,
                            size_t size)>
      check_object;
};

// One entry, as `optfuse cache ls` shows it.
struct CacheEntry {
  std::string key;
  std::string path;
  std::string kind;    // "kernel" or "runtime"
  std::string name;    // kernel's graph name, or "halide-runtime"
  std::string target;  // Halide target string
  uint64_t file_bytes = 0;
  uint64_t object_bytes = 0;
  double created = 0;    // Unix seconds
  double last_used = 0;  // Unix seconds (file modification time)
  std::string problem;   // empty if the entry is valid (verify); else what is wrong
};

struct CacheStats {
  std::string dir;
  uint64_t entries = 0;
  uint64_t bytes = 0;
  uint64_t max_bytes = 0;
  uint64_t kernels = 0;
  uint64_t runtimes = 0;
  // This object's activity:
  uint64_t hits = 0, misses = 0, writes = 0, rejected = 0, evictions = 0;
  bool degraded = false;  // writes go to memory only (read-only directory, full disk)
};

class DiskCache : public ObjectStore {
 public:
  // Creates the directory if needed; never throws for an unusable directory (degrades instead).
  explicit DiskCache(CacheOptions options);
  ~DiskCache() override;

  bool get(const std::string& key, std::vector<char>* object) override;
  void put(const std::string& key, const std::vector<char>& object) override;
  bool get(const std::string& key, const ObjectInfo& info, std::vector<char>* object) override;
  void put(const std::string& key, const ObjectInfo& info,
           const std::vector<char>& object) override;
  std::shared_ptr<void> lock(const std::string& key) override;

  // Every entry file, oldest use first; `verify` reads and checks each (else metadata only).
  std::vector<CacheEntry> list(bool verify = false) const;
  CacheStats stats() const;
  // Removes invalid entries and stray temporary files, then evicts LRU entries until the total is
  // at most `max_bytes`. Returns the entries removed.
  std::vector<CacheEntry> prune(uint64_t max_bytes);
  void clear();  // removes every entry, lock and temporary file

  const std::string& dir() const { return options_.dir; }
  bool degraded() const;

 private:
  void warn(const std::string& message) const;
  void degrade(const std::string& why);
  std::string entry_path(const std::string& key) const;
  std::vector<CacheEntry> list_locked(bool verify, uint64_t* total_bytes) const;

  CacheOptions options_;
  std::string root_;  // dir/v1
  mutable std::mutex mutex_;
  bool degraded_ = false;
  bool untrusted_ = false;  // writable by other users: neither read nor written
  std::map<std::string, std::vector<char>> memory_;  // used once degraded
  mutable CacheStats counters_;
};

}  // namespace optfuse
