#pragma once
// The few file operations the cache needs, POSIX underneath, reporting errors as text (the cache
// turns them into warnings; none of these throw). The trust rules they apply are the cache's
// (cache/README.md, "Trust").
#include <sys/stat.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace optfuse::cache {

// Creates `dir` and its missing parents, each with mode 0775 less the umask: never writable by
// all users, whatever the umask (under umask 000 a plain mkdir makes 0777 directories, which the
// trust check below then refuses).
bool make_dirs(const std::string& dir, std::string* error);

// Why a file or directory cannot be trusted to hold code this process runs, and what fixes it;
// both empty when it can.
struct Distrust {
  std::string why;  // "/c/v1 is writable by all users (mode 0777)"
  std::string fix;  // "chmod o-w /c/v1"
  bool empty() const { return why.empty(); }
};

// A directory of the cache's tree (symlinks followed): owned by this user or root, and not
// writable by all users. (Group-writable is allowed: with per-user groups and umask 002 every
// directory is.) One that cannot be stat'ed is not judged here: the caller's own errors say why.
Distrust untrusted_directory(const std::string& dir);
// An entry file, from its lstat: a regular file (not a symlink), owned by this user or root, and
// not writable by all users.
Distrust untrusted_file(const std::string& path, const struct stat& st);

enum class ReadStatus {
  kOk,
  kAbsent,   // no such file
  kInvalid,  // a file the caller must not read: too large, not regular, or (`entry`) untrusted
  kError,    // it could not be read (permissions, I/O)
};

struct ReadOptions {
  // A larger file is kInvalid, found from its size before anything is allocated.
  uint64_t max_bytes = 0;
  // Read only the first `max_bytes` bytes of a larger file instead (listing needs the header).
  bool prefix = false;
  // A cache entry: not followed if a symlink, and untrusted_file() must pass.
  bool entry = false;
};

// Reads a file; a directory, FIFO or device is kInvalid, never a blocking open. `*error` says
// what is wrong for any status but kOk.
ReadStatus read_file(const std::string& path, std::vector<char>* bytes, std::string* error,
                     const ReadOptions& options);

// Writes `bytes` to a new temporary file next to `path` (`<path>.tmp.<pid>.<random>`, created
// O_EXCL: a leftover of a dead writer, even one whose pid this process now has, is never in the
// way), fsyncs it, renames it onto `path` and fsyncs the directory: readers see the old file or
// the whole new one, never a part.
bool atomic_write(const std::string& path, const std::vector<char>& bytes, std::string* error);
// Whether `name` is such a temporary file's.
bool is_temporary_name(const std::string& name);

// Whether `path` names a directory (following symlinks); false when it cannot be stat'ed.
bool is_directory(const std::string& path);
// Sets the file's modification time to now (the LRU clock); errors are ignored.
void touch(const std::string& path);

// An exclusive flock on `path` (created if needed, never through a symlink), polled until
// `timeout_s`; null if it could not be taken in time or the file cannot be opened. Released when
// the handle is destroyed, and by the kernel if the process dies.
std::shared_ptr<void> lock_file(const std::string& path, double timeout_s);
// Removes the lock file `path` if no process holds its lock (taken without waiting, so a live
// holder keeps its file); false if it is held or cannot be removed.
bool remove_unheld_lock(const std::string& path);

}  // namespace optfuse::cache
