#include "cache/fs.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>

namespace optfuse::cache {
namespace fs = std::filesystem;

namespace {

bool fail(std::string* error, const std::string& what) {
  *error = what + ": " + std::strerror(errno);
  return false;
}

ReadStatus failed(std::string* error, const std::string& what, ReadStatus status) {
  fail(error, what);
  return status;
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_;
};

std::string mode_text(mode_t mode) {
  char text[8];
  std::snprintf(text, sizeof text, "%04o", static_cast<unsigned>(mode & 07777));
  return text;
}

// The owner and mode rules every level of the cache shares (cache/README.md, "Trust").
Distrust owner_and_mode(const std::string& path, const struct stat& st) {
  if (st.st_uid != ::geteuid() && st.st_uid != 0)
    return {path + " is owned by uid " + std::to_string(st.st_uid) + ", not this user (uid " +
                std::to_string(::geteuid()) + ") or root",
            "use a cache directory you own (--cache-dir, or OPTFUSE_CACHE_DIR)"};
  if (st.st_mode & S_IWOTH)
    return {path + " is writable by all users (mode " + mode_text(st.st_mode) + ")",
            "chmod o-w " + path +
                ", or use a cache directory only you can write (--cache-dir, "
                "or OPTFUSE_CACHE_DIR)"};
  return {};
}

// A name no other writer uses: the pid, and 64 random bits (a pid alone repeats once a dead
// writer's pid is reused).
std::string temporary_name(const std::string& path) {
  static std::atomic<uint64_t> counter{std::random_device{}()};
  thread_local std::mt19937_64 rng(std::random_device{}() ^ counter++);
  char nonce[17];
  std::snprintf(nonce, sizeof nonce, "%016llx", static_cast<unsigned long long>(rng()));
  return path + ".tmp." + std::to_string(::getpid()) + "." + nonce;
}

// A new temporary file next to `path`, created O_EXCL; another name if one is taken.
int create_temporary(const std::string& path, std::string* tmp) {
  for (int attempt = 0;; ++attempt) {
    *tmp = temporary_name(path);
    int fd = ::open(tmp->c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0 || errno != EEXIST || attempt == 8) return fd;
  }
}

bool write_all(int fd, const std::vector<char>& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

// The file `fd` (of `st`) is one read_file may read, else kInvalid with `*error` saying why.
ReadStatus check_readable(const std::string& path, const struct stat& st,
                          const ReadOptions& options, std::string* error) {
  if (!S_ISREG(st.st_mode)) {
    *error = path + " is not a regular file" + (S_ISDIR(st.st_mode) ? " (a directory)" : "");
    return ReadStatus::kInvalid;
  }
  if (options.entry)
    if (Distrust d = untrusted_file(path, st); !d.empty()) {
      *error = d.why;
      return ReadStatus::kInvalid;
    }
  if (!options.prefix && static_cast<uint64_t>(st.st_size) > options.max_bytes) {
    *error = path + " is " + std::to_string(st.st_size) + " bytes, more than the " +
             std::to_string(options.max_bytes) + " bytes allowed";
    return ReadStatus::kInvalid;
  }
  return ReadStatus::kOk;
}

}  // namespace

bool is_directory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool make_dirs(const std::string& dir, std::string* error) {
  fs::path built;
  for (const fs::path& part : fs::path(dir)) {
    built /= part;
    if (part.empty() || part == built.root_path() || is_directory(built)) continue;
    // 0775: the umask may take more away (022 makes 0755), never add the others' write bit.
    if (::mkdir(built.c_str(), 0775) != 0 && errno != EEXIST)
      return fail(error, "cannot create directory " + built.string());
  }
  if (!is_directory(dir)) {
    errno = ENOTDIR;
    return fail(error, "cannot create directory " + dir);
  }
  return true;
}

Distrust untrusted_directory(const std::string& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return {};
  if (!S_ISDIR(st.st_mode)) return {dir + " is not a directory", "remove " + dir};
  return owner_and_mode(dir, st);
}

Distrust untrusted_file(const std::string& path, const struct stat& st) {
  if (S_ISLNK(st.st_mode)) return {path + " is a symbolic link", "remove " + path};
  return owner_and_mode(path, st);
}

ReadStatus read_file(const std::string& path, std::vector<char>* bytes, std::string* error,
                     const ReadOptions& options) {
  // O_NONBLOCK: a FIFO (or a device) put in place of a file must not block the open; such a
  // file is refused below, before any read. O_NOFOLLOW: an entry is never a symlink.
  int flags = O_RDONLY | O_CLOEXEC | O_NONBLOCK | (options.entry ? O_NOFOLLOW : 0);
  Fd fd(::open(path.c_str(), flags));
  if (fd.get() < 0) {
    if (errno == ENOENT) return failed(error, "cannot open " + path, ReadStatus::kAbsent);
    if (errno == ELOOP && options.entry) {
      *error = path + " is a symbolic link";
      return ReadStatus::kInvalid;
    }
    return failed(error, "cannot open " + path, ReadStatus::kError);
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return failed(error, "cannot stat " + path, ReadStatus::kError);
  if (ReadStatus s = check_readable(path, st, options, error); s != ReadStatus::kOk) return s;
  bytes->resize(static_cast<size_t>(
      std::min<uint64_t>(static_cast<uint64_t>(st.st_size), options.max_bytes)));
  size_t done = 0;
  while (done < bytes->size()) {
    ssize_t n = ::read(fd.get(), bytes->data() + done, bytes->size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return failed(error, "cannot read " + path, ReadStatus::kError);
    if (n == 0) break;  // shrank while reading: the checksum will tell
    done += static_cast<size_t>(n);
  }
  bytes->resize(done);
  return ReadStatus::kOk;
}

bool is_temporary_name(const std::string& name) { return name.find(".tmp.") != std::string::npos; }

bool atomic_write(const std::string& path, const std::vector<char>& bytes, std::string* error) {
  std::string tmp;
  Fd fd(create_temporary(path, &tmp));
  if (fd.get() < 0) return fail(error, "cannot create " + tmp);
  auto undo = [&](const std::string& what) {
    fail(error, what);
    ::unlink(tmp.c_str());
    return false;
  };
  if (!write_all(fd.get(), bytes)) return undo("cannot write " + tmp);
  if (::fsync(fd.get()) != 0 || ::close(fd.release()) != 0) return undo("cannot flush " + tmp);
  if (::rename(tmp.c_str(), path.c_str()) != 0) return undo("cannot rename " + tmp + " to " + path);
  Fd dir(::open(fs::path(path).parent_path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir.get() >= 0) ::fsync(dir.get());
  return true;
}

void touch(const std::string& path) {
  ::utimensat(AT_FDCWD, path.c_str(), nullptr, AT_SYMLINK_NOFOLLOW);
}

std::shared_ptr<void> lock_file(const std::string& path, double timeout_s) {
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) return nullptr;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  auto pause = std::chrono::milliseconds(1);
  while (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if ((errno != EWOULDBLOCK && errno != EINTR) || std::chrono::steady_clock::now() >= deadline) {
      ::close(fd);
      return nullptr;
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
  return std::shared_ptr<void>(reinterpret_cast<void*>(static_cast<intptr_t>(fd) + 1), [fd](void*) {
    ::flock(fd, LOCK_UN);
    ::close(fd);
  });
}

bool remove_unheld_lock(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
  if (fd.get() < 0) return ::unlink(path.c_str()) == 0;  // (a symlink or other stray: removed)
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) return false;
  // Unlinked while held: a process that opened it before and takes it after merely compiles a
  // key another also compiles, which the atomic rename makes harmless.
  return ::unlink(path.c_str()) == 0;
}

}  // namespace optfuse::cache
