#include "bench/support.h"

#include <cstdlib>
#include <new>
#include <vector>

#include "optfuse/error.h"

namespace optfuse::bench {

Engine& engine() {
  static Engine e;
  return e;
}

namespace {

struct Pool {
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  std::vector<std::unique_ptr<float, Free>> arrays;
  int64_t capacity = 0;  // elements per array
};

Pool& pool() {
  static Pool p;
  return p;
}

float* allocate(int64_t n) {
  size_t bytes = (static_cast<size_t>(n) * sizeof(float) + 4095) / 4096 * 4096;
  void* p = std::aligned_alloc(4096, bytes);
  if (p == nullptr) throw std::bad_alloc();
  return static_cast<float*>(p);
}

}  // namespace

Arrays::Arrays(int count, int64_t n) : count_(count), n_(n) {
  Pool& p = pool();
  if (n > p.capacity) {
    p.arrays.clear();
    p.capacity = n;
  }
  while (static_cast<int>(p.arrays.size()) < count) p.arrays.emplace_back(allocate(p.capacity));
  for (int a = 0; a < count; ++a) {
    float* d = p.arrays[static_cast<size_t>(a)].get();
    const float base = 0.25f + 0.125f * static_cast<float>(a);
    for (int64_t i = 0; i < n; ++i) d[i] = base + static_cast<float>(i & 1023) * (1.0f / 1024.0f);
  }
}

float* Arrays::operator[](int i) const {
  if (i < 0 || i >= count_) internal_error("bench array index out of range");
  return pool().arrays[static_cast<size_t>(i)].get();
}

KernelCall make_call(const Kernel& k, const std::map<std::string, float*>& tensors,
                     const std::map<std::string, double>& scalars, int64_t n,
                     const std::map<std::string, float*>& out) {
  const KernelSignature& sig = k.signature();
  KernelCall call;
  call.n = n;
  for (const auto& in : sig.inputs) {
    auto it = tensors.find(in.name);
    if (it == tensors.end()) throw Error(k.name() + ": no array given for input '" + in.name + "'");
    call.inputs.push_back(it->second);
  }
  for (const auto& s : sig.scalars) {
    auto it = scalars.find(s.name);
    if (it == scalars.end()) throw Error(k.name() + ": no value given for scalar '" + s.name + "'");
    call.scalars.push_back(it->second);
  }
  for (const auto& o : sig.outputs) {
    auto it = out.find(o.replaces);
    if (it != out.end()) {
      call.outputs.push_back(it->second);
      continue;
    }
    int i = sig.input_index(o.replaces);
    if (i < 0) throw Error(k.name() + ": output replaces unknown input '" + o.replaces + "'");
    call.outputs.push_back(call.inputs[static_cast<size_t>(i)]);
  }
  return call;
}

std::string label(const Kernel& k) {
  return k.name() + " " + k.key().substr(0, 16) + " " + engine().options().schedule.str();
}

}  // namespace optfuse::bench
