// The `optfuse` command line as users meet it: exit statuses (0 done, 1 failed, 2 usage), unknown
// commands named, warmup that never reports success for nothing, `cache ls` columns, and one
// schedules location: what `tune` writes is what `explain` and `warmup` read.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "support/cli.h"

namespace optfuse {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;
using Result = testing::CliResult;

const std::string kTinySpec = std::string(OPTFUSE_TEST_DATA_DIR) + "/specs/tiny.json";

class Cli : public testing::CliTest {
 protected:
  void SetUp() override {
    CliTest::SetUp();
    // Every schedules location this process's children look at is under dir().
    ::unsetenv("OPTFUSE_SCHEDULES");
    ::setenv("XDG_DATA_HOME", (dir() + "/data").c_str(), 1);
  }
};

TEST_F(Cli, UsageErrorsExitTwoOnEveryCommand) {
  for (const auto& args : std::vector<std::vector<std::string>>{
           {},                                             // no command
           {"demo", "--steps", "zero"},                    // not a number
           {"demo", "--no-such-flag"},                     // unknown option
           {"demo", "--dtype", "f64"},                     // not among the choices
           {"warmup"},                                     // --spec is required
           {"warmup", "--spec", dir() + "/missing.json"},  // no such file
           {"cache"},                                      // a sub-command is required
           {"cache", "ls", "--bogus"},                     //
           {"explain"},                                    // neither --graph nor --spec
           {"explain", "--graph", "a", "--spec", "b"},     //
           {"tune"},                                       // nothing to tune
           {"tune", "--budget", "-1", "--all"},            // out of range
           {"tune", "--optimizer", "adamm"},               // no such optimizer
           {"cache", "prune", "--max-size", "10Q"},        // not a size
           {"warmup", "--spec", kTinySpec, "--target", "x86-64-plan9"},  // not a target
           {"explain", "--spec", kTinySpec, "--target", "nonsense"},     //
       }) {
    Result r = cli(args);
    std::string line;
    for (const auto& a : args) line += a + " ";
    EXPECT_EQ(r.rc, 2) << "optfuse " << line << "\n" << r.err;
    EXPECT_FALSE(r.err.empty()) << line;
  }
}

TEST_F(Cli, UnknownCommandIsNamed) {
  Result r = cli({"frobnicate", "--x"});
  EXPECT_EQ(r.rc, 2);
  EXPECT_THAT(r.err, HasSubstr("optfuse: unknown command 'frobnicate'"));
  EXPECT_THAT(r.err, HasSubstr("demo, warmup, cache, explain, tune"));
  r = cli({"cache", "list"});
  EXPECT_EQ(r.rc, 2);
  EXPECT_THAT(r.err, HasSubstr("optfuse cache: unknown command 'list' (commands: ls, stats"));
}

TEST_F(Cli, HelpAndVersionExitZero) {
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"--help"}, {"--version"}, {"explain", "--help"}, {"tune", "--help"}}) {
    Result r = cli(args);
    EXPECT_EQ(r.rc, 0) << args[0];
    EXPECT_FALSE(r.out.empty()) << args[0];
  }
}

TEST_F(Cli, WarmupIntoAnUnusableCacheFails) {
  // World-writable: refused (cache/README.md, "Trust"). Compiling into it would keep nothing.
  fs::create_directories(cache());
  ::chmod(cache().c_str(), 0777);
  Result r = cli({"warmup", "--spec", kTinySpec, "--cache-dir", cache()});
  EXPECT_EQ(r.rc, 1);
  EXPECT_THAT(r.err, HasSubstr("nothing can be cached"));
  EXPECT_THAT(r.out + r.err, Not(HasSubstr("compiled in")));
  if (::geteuid() == 0) GTEST_SKIP() << "root writes into read-only directories";
  // Read-only (the common case for a shared, pre-filled cache mounted for reading).
  ::chmod(cache().c_str(), 0555);
  r = cli({"warmup", "--spec", kTinySpec, "--cache-dir", cache()});
  EXPECT_EQ(r.rc, 1);
  EXPECT_THAT(r.err, HasSubstr("nothing can be cached"));
}

TEST_F(Cli, CacheLsColumnsLineUp) {
  // (Two targets whatever the host: an AVX2 machine's host is the AVX2 one.)
  ASSERT_EQ(cli({"warmup", "--spec", kTinySpec, "--cache-dir", cache(), "--target",
                 "x86-64-linux-sse41,x86-64-linux-avx-avx2-f16c-fma-sse41"})
                .rc,
            0);
  Result ls = cli({"cache", "ls", "--cache-dir", cache()});
  ASSERT_EQ(ls.rc, 0) << ls.err;
  std::istringstream lines(ls.out);
  std::vector<std::string> rows;
  for (std::string l; std::getline(lines, l);) rows.push_back(l);
  ASSERT_GE(rows.size(), 5u);  // header + 2 targets x (runtime + 2 kernels)
  // Each left-aligned column starts where its header does, whatever the lengths before it; the
  // sizes are right-aligned under theirs.
  auto starts_at = [](const std::string& row, size_t at) {
    return row.size() > at && row[at - 1] == ' ' && row[at] != ' ';
  };
  for (const char* column : {"kind", "name", "last used", "target"}) {
    const size_t at = rows[0].find(column);
    ASSERT_NE(at, std::string::npos) << column;
    for (size_t i = 1; i < rows.size(); ++i)
      EXPECT_TRUE(starts_at(rows[i], at)) << column << ": " << rows[i];
  }
  const size_t bytes_end = rows[0].find("bytes") + 5;
  for (size_t i = 1; i < rows.size(); ++i) {
    EXPECT_TRUE(std::isdigit(static_cast<unsigned char>(rows[i][bytes_end - 1]))) << rows[i];
    EXPECT_EQ(rows[i][bytes_end], ' ') << rows[i];
  }
}

TEST_F(Cli, TuneWritesWhereTheOtherCommandsRead) {
  // Nothing tuned yet: explain reads the shipped databases (or none for this target).
  Result before = cli({"explain", "--spec", kTinySpec, "--json"});
  ASSERT_EQ(before.rc, 0) << before.err;
  Result tuned = cli({"tune", "--optimizer", "sgd", "--sizes", "4096", "--budget", "3", "--json"});
  ASSERT_EQ(tuned.rc, 0) << tuned.err;
  const std::string db = tuned.json()["db"];
  EXPECT_EQ(db.rfind(dir() + "/data/optfuse/schedules/", 0), 0u) << db;
  EXPECT_TRUE(fs::is_regular_file(db)) << db;

  Result after = cli({"explain", "--spec", kTinySpec, "--json"});
  ASSERT_EQ(after.rc, 0) << after.err;
  EXPECT_EQ(after.json()["schedules"], db);  // the per-user database, without being told
  Result warm = cli({"warmup", "--spec", kTinySpec, "--cache-dir", cache(), "--json"});
  ASSERT_EQ(warm.rc, 0) << warm.err;
  // The keys explain prints are the ones warmup compiles.
  std::set<std::string> explained, compiled;
  const nlohmann::json explain_json = after.json(), warmup_json = warm.json();
  for (const auto& g : explain_json["param_groups"])
    for (const auto& k : g["kernels"]) explained.insert(k["key"].get<std::string>());
  for (const auto& item : warmup_json["items"])
    if (item["kind"] == "kernel") compiled.insert(item["key"].get<std::string>());
  EXPECT_EQ(explained, compiled);
  EXPECT_FALSE(compiled.empty());

  // --schedules none on both: defaults, and again the same keys.
  Result none = cli({"explain", "--spec", kTinySpec, "--json", "--schedules", "none"});
  ASSERT_EQ(none.rc, 0) << none.err;
  EXPECT_EQ(none.json()["schedules"], "");
  EXPECT_EQ(none.json()["tuned_schedules"], 0);
}

TEST_F(Cli, TuneRefusesToWriteNowhere) {
  Result r = cli(
      {"tune", "--optimizer", "sgd", "--sizes", "4096", "--budget", "1", "--schedules", "none"});
  EXPECT_EQ(r.rc, 1);
  EXPECT_THAT(r.err, HasSubstr("nowhere to write"));
}

// Before: "--steps: Value abc not in range 1 to 100000" for a value that is no number at all.
TEST_F(Cli, NumbersThatAreNotNumbersSaySo) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"demo", "--steps", "abc"}, "--steps: 'abc' is not a number"},
      {{"demo", "--steps", "2.5"}, "--steps: '2.5' is not a whole number"},
      {{"demo", "--steps", "0"}, "--steps: 0 is not in the range 1 to 100000"},
      {{"warmup", "--spec", kTinySpec, "--jobs", "many"}, "--jobs: 'many' is not a number"},
      {{"tune", "--all", "--min-gain", "2%"}, "--min-gain: '2%' is not a number"},
      {{"tune", "--all", "--sizes", "1e3x"}, "--sizes: '1e3x' is not a number"},
  };
  for (const auto& [args, message] : cases) {
    Result r = cli(args);
    EXPECT_EQ(r.rc, 2) << message;
    EXPECT_THAT(r.err, HasSubstr(message));
    EXPECT_THAT(r.err, Not(HasSubstr("not in range")));
  }
}

// Before: "<spec>: not valid JSON", with no line or column to look at.
TEST_F(Cli, MalformedSpecSaysWhere) {
  const std::string spec = dir() + "/truncated.json";
  std::ofstream(spec) << "{\n  \"optimizer\": {\"type\": \"sgd\"},\n  \"parameters\": [\n"
                         "    {\"name\": \"w\", \"shape\": [2, 2]},\n";
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"warmup", "--spec", spec, "--cache-dir", cache()}, {"explain", "--spec", spec}}) {
    Result r = cli(args);
    EXPECT_EQ(r.rc, 1) << args[0];
    EXPECT_THAT(r.err, HasSubstr(spec + ":5:1: not valid JSON: syntax error while parsing value - "
                                        "unexpected end of input"))
        << args[0];
  }
  std::ofstream(spec) << "{\"optimizer\": {\"type\": \"sgd\"},\n  \"parameters\": [}\n";
  Result r = cli({"warmup", "--spec", spec, "--cache-dir", cache()});
  EXPECT_THAT(r.err, HasSubstr(spec + ":2:18: not valid JSON: syntax error"));
}

}  // namespace
}  // namespace optfuse
