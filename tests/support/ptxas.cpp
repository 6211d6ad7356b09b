#include "support/ptxas.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "jit/halide_bridge.h"

namespace optfuse::testing {

namespace fs = std::filesystem;

std::vector<char> cuda_object(const Graph& g, const std::string& target,
                              const std::string& fn_name) {
  std::string resolved = jit::resolve_target(target);
  return jit::compile_kernel_object(canonicalize(g), jit::resolve_schedule(Schedule{}, resolved),
                                    resolved, fn_name);
}

std::string find_ptxas() {
  if (access("/usr/local/cuda/bin/ptxas", X_OK) == 0) return "/usr/local/cuda/bin/ptxas";
  if (std::system("command -v ptxas > /dev/null 2>&1") == 0) return "ptxas";
  return "";
}

std::string ptxas(const std::string& tool, const std::string& ptx, const std::string& arch,
                  const std::string& label) {
  fs::path dir = fs::temp_directory_path() / ("optfuse-ptx-" + std::to_string(getpid()));
  fs::create_directories(dir);
  fs::path in = dir / (label + ".ptx"), out = dir / (label + "." + arch + ".cubin"),
           log = dir / (label + "." + arch + ".log");
  std::ofstream(in) << ptx;
  std::string cmd = tool + " -arch=" + arch + " " + in.string() + " -o " + out.string() + " > " +
                    log.string() + " 2>&1";
  int rc = std::system(cmd.c_str());
  std::ifstream l(log);
  std::string text((std::istreambuf_iterator<char>(l)), {});
  fs::remove_all(dir);
  return rc == 0 ? "" : "ptxas -arch=" + arch + " failed (" + std::to_string(rc) + "): " + text;
}

}  // namespace optfuse::testing
