#pragma once
// Sets (or, with nullptr, removes) an environment variable for one scope, then puts back what was
// there: CTest points $OPTFUSE_CACHE_DIR and $XDG_DATA_HOME at the build tree for every test
// (tests/CMakeLists.txt), and a test that changes them must not leak into the next.
#include <cstdlib>
#include <optional>
#include <string>

namespace optfuse::testing {

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    value ? ::setenv(name, value, 1) : ::unsetenv(name);
  }
  ScopedEnv(const char* name, const std::string& value) : ScopedEnv(name, value.c_str()) {}
  ~ScopedEnv() { old_ ? ::setenv(name_, old_->c_str(), 1) : ::unsetenv(name_); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

}  // namespace optfuse::testing
