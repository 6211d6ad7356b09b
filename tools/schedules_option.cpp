#include "tools/schedules_option.h"

namespace optfuse::tools {

void add_schedules_option(CLI::App* cmd, std::string* flag) {
  cmd->add_option("--schedules", *flag,
                  "tuned schedules: a database file or a directory of <target>.json files; "
                  "\"none\" = default schedules only (default: $OPTFUSE_SCHEDULES, else the "
                  "per-user directory `optfuse tune` writes to, else the shipped databases)");
}

}  // namespace optfuse::tools
