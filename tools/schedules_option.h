#pragma once
// The schedule database the tools run with (include/optfuse/schedules.h): `--schedules PATH` if
// given, else $OPTFUSE_SCHEDULES, else the repository's schedules/ directory (its
// `<resolved target>.json`, when present, is used). "none" (flag or variable): defaults only.
#include <CLI/CLI.hpp>
#include <string>

namespace optfuse::tools {

void add_schedules_option(CLI::App* cmd, std::string* flag);
// The value for EngineOptions::schedule_db.
std::string tool_schedule_db(const std::string& flag);

}  // namespace optfuse::tools
