// The `optfuse` command: one sub-command per way users meet optfuse.
// Exit status: 0 done, 1 the work failed (optfuse::Error), 2 the command line is wrong.
#include <iostream>
#include <string>

#include "optfuse/error.h"
#include "tools/commands.h"

namespace {

constexpr int kUsage = 2;

// The names of `app`'s sub-commands, for messages: "demo, warmup, cache, explain, tune".
std::string subcommand_names(CLI::App* app) {
  std::string names;
  for (CLI::App* sub : app->get_subcommands({}))
    names += (names.empty() ? "" : ", ") + sub->get_name();
  return names;
}

// CLI11 reports `optfuse frob` as an unexpected argument; say which command is unknown instead.
// Walks the words naming sub-commands; the first word that should name one and does not is it.
std::string unknown_subcommand(CLI::App& app, int argc, char** argv) {
  CLI::App* at = &app;
  std::string path = "optfuse";
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (word.empty() || word[0] == '-') return "";  // options: CLI11 checks those
    if (at->get_subcommands({}).empty()) return "";
    CLI::App* next = nullptr;
    try {
      next = at->get_subcommand(word);
    } catch (const CLI::OptionNotFound&) {
      return path + ": unknown command '" + word + "' (commands: " + subcommand_names(at) + ")";
    }
    at = next;
    path += " " + word;
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"optfuse: fused, JIT-compiled optimizer update kernels"};
  app.require_subcommand(1);
  app.set_version_flag("--version", OPTFUSE_VERSION_STRING);
  optfuse::tools::add_demo_command(app);
  optfuse::tools::add_warmup_command(app);
  optfuse::tools::add_cache_command(app);
  optfuse::tools::add_explain_command(app);
  optfuse::tools::add_tune_command(app);
  if (std::string unknown = unknown_subcommand(app, argc, argv); !unknown.empty()) {
    std::cerr << unknown << "\nRun with --help for more information.\n";
    return kUsage;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::RuntimeError& e) {  // a command's own non-zero status
    return e.get_exit_code();
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);  // prints help, the version, or the error and a --help hint
    return rc == 0 ? 0 : kUsage;
  } catch (const optfuse::tools::UsageError& e) {
    std::cerr << "optfuse: error: " << e.what() << "\nRun with --help for more information.\n";
    return kUsage;
  } catch (const optfuse::Error& e) {
    std::cerr << "optfuse: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
