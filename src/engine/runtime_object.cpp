#include "engine/runtime_object.h"

#include <future>
#include <map>
#include <mutex>

#include "jit/embedded_runtime.h"
#include "jit/halide_bridge.h"

namespace optfuse::engine_detail {
namespace {

using Object = std::shared_ptr<const std::vector<char>>;

struct Slot {
  std::shared_future<Object> object;
  bool taken = false;  // a runtime_object() call has reported it compiled
};

std::mutex mutex;
std::map<std::string, Slot> slots;  // by target

Object compile(const std::string& target) {
  return std::make_shared<const std::vector<char>>(jit::compile_runtime_object(target));
}

}  // namespace

std::shared_ptr<const std::vector<char>> runtime_object(const std::string& target, bool* compiled) {
  if (Object embedded = jit::embedded_runtime(target)) {
    *compiled = false;
    return embedded;
  }
  std::shared_future<Object> object;
  {
    std::lock_guard<std::mutex> lock(mutex);
    Slot& slot = slots[target];
    if (!slot.object.valid())  // compiled on this thread, below, without the lock held
      slot.object = std::async(std::launch::deferred, compile, target).share();
    object = slot.object;
    *compiled = !slot.taken;
    slot.taken = true;
  }
  try {
    return object.get();  // a deferred compile runs once, in the first caller; others wait
  } catch (...) {
    std::lock_guard<std::mutex> lock(mutex);
    slots.erase(target);  // the next caller tries again
    throw;
  }
}

void compile_runtime_soon(const std::string& target, const std::function<bool()>& stored) {
  if (jit::embedded_runtime(target)) return;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (auto it = slots.find(target); it != slots.end() && it->second.object.valid()) return;
  }
  if (stored()) return;
  std::lock_guard<std::mutex> lock(mutex);
  Slot& slot = slots[target];
  if (!slot.object.valid()) slot.object = std::async(std::launch::async, compile, target).share();
}

}  // namespace optfuse::engine_detail
