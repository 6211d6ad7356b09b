#include "tools/schedules_option.h"

#include "optfuse/schedules.h"

#ifndef OPTFUSE_SOURCE_DIR
#error "OPTFUSE_SOURCE_DIR must be defined by the build (CMakeLists.txt)"
#endif

namespace optfuse::tools {

void add_schedules_option(CLI::App* cmd, std::string* flag) {
  cmd->add_option("--schedules", *flag,
                  "tuned schedules: a database file or a directory of <target>.json files; "
                  "\"none\" = default schedules only (default: $OPTFUSE_SCHEDULES, else the "
                  "repository's schedules/)");
}

std::string tool_schedule_db(const std::string& flag) {
  std::string db = flag.empty() ? default_schedule_db(OPTFUSE_SOURCE_DIR "/schedules") : flag;
  return db == "none" ? "" : db;
}

}  // namespace optfuse::tools
