#pragma once
// The `optfuse` command (OPTFUSE_CLI_PATH) as a separate process, for the CLI tests: stdout and
// stderr go to files `<prefix>.out` / `<prefix>.err`; the process inherits this one's environment.
#include <gtest/gtest.h>
#include <sys/types.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace optfuse::testing {

struct CliResult {
  int rc = -1;  // exit status; -1 if it did not exit normally
  std::string out, err;
  nlohmann::json json() const { return nlohmann::json::parse(out); }
};

pid_t start_cli(const std::vector<std::string>& args, const std::string& prefix);
CliResult finish_cli(pid_t pid, const std::string& prefix);
inline CliResult run_cli(const std::vector<std::string>& args, const std::string& prefix) {
  return finish_cli(start_cli(args, prefix), prefix);
}

// A test of the command line: a scratch directory (`dir()`, with `cache()` in it), and cli() to
// run the command with its output kept there.
class CliTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;
  const std::string& dir() const { return dir_; }
  std::string cache() const { return dir_ + "/cache"; }
  CliResult cli(const std::vector<std::string>& args) {
    return run_cli(args, dir_ + "/io/" + std::to_string(n_++));
  }

 private:
  std::string dir_;
  int n_ = 0;
};

}  // namespace optfuse::testing
