#include "engine/runtime_object.h"

#include <map>
#include <mutex>

#include "jit/halide_bridge.h"

namespace optfuse::engine_detail {

std::shared_ptr<const std::vector<char>> runtime_object(const std::string& target, bool* compiled) {
  static std::mutex mutex;
  static std::map<std::string, std::shared_ptr<const std::vector<char>>> objects;
  std::lock_guard<std::mutex> lock(mutex);  // held while compiling: others wait, not repeat
  std::shared_ptr<const std::vector<char>>& slot = objects[target];
  *compiled = !slot;
  if (!slot) slot = std::make_shared<const std::vector<char>>(jit::compile_runtime_object(target));
  return slot;
}

}  // namespace optfuse::engine_detail
