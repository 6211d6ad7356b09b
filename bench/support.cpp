#include "bench/support.h"

#include <algorithm>
#include <cstddef>
#include <new>

#include "optfuse/error.h"
#include "optfuse/optim.h"
#include "tools/bandwidth.h"
#include "tools/unfused.h"

namespace optfuse::bench {

Engine& engine() {
  static Engine e;
  return e;
}

namespace {

struct Pool {
  std::vector<FloatBuffer> arrays;
  int64_t capacity = 0;  // elements per array
};

Pool& pool() {
  static Pool p;
  return p;
}

}  // namespace

FloatBuffer allocate_floats(int64_t n) {
  size_t bytes = (static_cast<size_t>(n) * sizeof(float) + 4095) / 4096 * 4096;
  void* p = std::aligned_alloc(4096, bytes);
  if (p == nullptr) throw std::bad_alloc();
  return FloatBuffer(static_cast<float*>(p));
}

void fill_array(float* d, int64_t n, int index) {
  const float base = 0.25f + 0.125f * static_cast<float>(index);
  for (int64_t i = 0; i < n; ++i) d[i] = base + static_cast<float>(i & 1023) * (1.0f / 1024.0f);
}

Arrays::Arrays(int count, int64_t n) : count_(count), n_(n) {
  Pool& p = pool();
  if (n > p.capacity) {
    p.arrays.clear();
    p.capacity = n;
  }
  while (static_cast<int>(p.arrays.size()) < count) p.arrays.push_back(allocate_floats(p.capacity));
  for (int a = 0; a < count; ++a) fill_array(p.arrays[static_cast<size_t>(a)].get(), n, a);
}

float* Arrays::operator[](int i) const {
  if (i < 0 || i >= count_) internal_error("bench array index out of range");
  return pool().arrays[static_cast<size_t>(i)].get();
}

KernelCall make_call(const Kernel& k, const std::map<std::string, float*>& tensors,
                     const std::map<std::string, double>& scalars, int64_t n,
                     const std::map<std::string, float*>& out) {
  return tools::bind_call(k, tensors, scalars, n, out);
}

double median(std::vector<double> v) {
  if (v.empty()) internal_error("median of no values");
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

const std::string& ceiling_optimizer_type() {
  static const std::string type = [] {
    CustomOptimizer def;
    def.type = "bench_ceiling_4r3w";
    def.defaults = {{"lr", 0.0}};  // unused by the graph
    def.graph = [](const Options&) { return tools::stream_4r3w_graph(); };
    register_optimizer(def);
    return def.type;
  }();
  return type;
}

std::string label(const Kernel& k) {
  return k.name() + " " + k.key().substr(0, 16) + " " + engine().options().schedule.str();
}

}  // namespace optfuse::bench
