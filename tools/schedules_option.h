#pragma once
// `--schedules PATH` on every command that compiles kernels: its value goes to
// EngineOptions::schedule_db as it is, so each command finds the same database by the same rule
// (resolve_schedule_db, include/optfuse/schedules.h) and `tune` writes where they read.
#include <CLI/CLI.hpp>
#include <string>

namespace optfuse::tools {

void add_schedules_option(CLI::App* cmd, std::string* flag);

}  // namespace optfuse::tools
