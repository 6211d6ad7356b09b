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
// - Every level of the tree is checked before it is used (cache/README.md, "Trust"): the
//   directory, `v1/` and `v1/locks/` when the cache is opened, a shard `v1/<k0k1>/` before an
//   entry in it is read or written, an entry file when it is read. A directory writable by all
//   users, or one owned by another user (root excepted), is not used, with one warning that says
//   why and what fixes it: its entries are native code this process would run. An entry file
//   that is a symlink, owned by another user or writable by all is an invalid entry.
// - Sizes are checked before anything is allocated: a file larger than kMaxEntryBytes is an
//   invalid entry, whatever it holds.
// - lock(key) takes an flock on `<dir>/v1/locks/<key>.lock` (waiting at most lock_timeout_s): a
//   dead holder's lock is released by the kernel, so there is never a deadlock.
// - The total size is kept under max_bytes by evicting least-recently-used entries (a hit touches
//   the entry's modification time).
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "optfuse/object_store.h"

namespace optfuse {

// `--cache-dir` resolution without the flag: $OPTFUSE_CACHE_DIR, else $XDG_CACHE_HOME/optfuse,
// else $HOME/.cache/optfuse (else ./.optfuse-cache if HOME is unset).
std::string default_cache_dir();

// "1G", "512M", "64k", "1000" (bytes) -> bytes; throws Error naming `text` otherwise.
uint64_t parse_size(const std::string& text);

// The largest entry file read: a kernel object is kilobytes, a runtime a few megabytes.
inline constexpr uint64_t kMaxEntryBytes = uint64_t{256} << 20;
// A temporary file older than this belongs to a writer that died (a write takes well under a
// second); prune() and clear() remove such files.
inline constexpr double kStaleTemporarySeconds = 600;

// Links objects as loading them would, in a JIT thrown away afterwards: what `optfuse cache
// verify` asks of every entry beyond its checksums (CacheOptions::linker).
class ObjectLinker {
 public:
  virtual ~ObjectLinker() = default;
  // What is wrong with `object`, the entry `key` of `kind` for `target`, once linked ("" if
  // nothing, or if it cannot be linked in this process: another machine's code). A kernel links
  // against the runtime last checked for its target, else one compiled for it.
  virtual std::string link_problem(const std::string& kind, const std::string& target,
                                   const std::string& key, const std::vector<char>& object) = 0;
};

struct CacheOptions {
  std::string dir;                         // required
  uint64_t max_bytes = uint64_t{1} << 30;  // LRU cap, 1 GiB
  double lock_timeout_s = 120;             // how long lock() waits for another compiler
  // Create the directories when missing. false: open an existing cache only (listing and
  // maintenance: `optfuse cache` never creates a directory it was pointed at by mistake).
  bool create = true;
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
  // Makes the linker list(verify = true) links every valid entry with (unset: not linked).
  std::function<std::unique_ptr<ObjectLinker>()> linker;
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
  // Removes `key`'s entry, with one warning naming it and `why` (e.g. it did not link).
  void discard(const std::string& key, const std::string& why) override;

  // Every entry, oldest use first, and whatever else sits under an entry's name (a directory, a
  // FIFO: listed with a problem); `verify` reads, checks and (with CacheOptions::linker) links
  // each, else reads the metadata only. An entry in a shard that is not trusted has a problem.
  std::vector<CacheEntry> list(bool verify = false) const;
  CacheStats stats() const;
  // Removes invalid entries (directories in their place included), shards that are not trusted
  // and temporary files older than kStaleTemporarySeconds, then evicts LRU entries until the
  // total is at most `max_bytes`. Returns what it removed.
  std::vector<CacheEntry> prune(uint64_t max_bytes);
  // Removes every entry, temporary file and lock file; a lock a running process holds is left
  // (its file is its lock). Returns the number of lock files left.
  size_t clear();

  const std::string& dir() const { return options_.dir; }
  bool degraded() const;
  // Why this cache is not used at all, and the fix ("" when it is used): a directory of its tree
  // is writable by all users or owned by another user.
  std::string unusable() const;

 private:
  void warn(const std::string& message) const;
  void degrade(const std::string& why);
  void check_trust();
  bool shard_trusted_locked(const std::string& shard);
  bool read_locked(const std::string& key, const ObjectInfo& info, std::vector<char>* object);
  void reject_locked(const std::string& path, const std::string& problem, bool quietly);
  void evict_locked(const std::string& keep_key);
  std::string entry_path(const std::string& key) const;
  std::vector<CacheEntry> list_locked(bool verify, uint64_t* total_bytes) const;
  void link_check_locked(std::vector<CacheEntry>* entries) const;

  CacheOptions options_;
  std::string root_;  // dir/v1
  mutable std::mutex mutex_;
  bool degraded_ = false;
  std::string unusable_;                    // why no level of the tree is used ("" when it is)
  std::set<std::string> untrusted_shards_;  // warned about once each
  std::map<std::string, std::vector<char>> memory_;  // used once degraded
  mutable CacheStats counters_;
};

}  // namespace optfuse
