#pragma once
// Each `optfuse` sub-command registers itself on the CLI11 app; the callback runs the command.
#include <CLI/CLI.hpp>

namespace optfuse::tools {

void add_demo_command(CLI::App& app);
void add_warmup_command(CLI::App& app);
void add_cache_command(CLI::App& app);
void add_explain_command(CLI::App& app);

}  // namespace optfuse::tools
