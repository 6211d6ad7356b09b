#pragma once
// Each `optfuse` sub-command registers itself on the CLI11 app; the callback runs the command.
// Exit status (tools/main.cpp): 0 done, 1 the work failed, 2 the command line is wrong.
#include <CLI/CLI.hpp>
#include <string>

#include "optfuse/error.h"

namespace optfuse::tools {

// A command line that parses but asks for something impossible (no input named, two that exclude
// each other, a value no option takes): exit status 2, like CLI11's own parse errors.
struct UsageError : Error {
  using Error::Error;
};

void add_demo_command(CLI::App& app);
void add_warmup_command(CLI::App& app);
void add_cache_command(CLI::App& app);
void add_explain_command(CLI::App& app);
void add_tune_command(CLI::App& app);

}  // namespace optfuse::tools
