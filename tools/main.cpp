// The `optfuse` command: one sub-command per way users meet optfuse.
#include <iostream>

#include "optfuse/error.h"
#include "tools/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"optfuse: fused, JIT-compiled optimizer update kernels"};
  app.require_subcommand(1);
  app.set_version_flag("--version", OPTFUSE_VERSION_STRING);
  optfuse::tools::add_demo_command(app);
  optfuse::tools::add_warmup_command(app);
  optfuse::tools::add_cache_command(app);
  optfuse::tools::add_explain_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const optfuse::Error& e) {
    std::cerr << "optfuse: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
