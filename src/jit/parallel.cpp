// Kernels' parallel loops (Halide's halide_do_par_for) on an OpenMP runtime the process
// already runs, when one is set (include/optfuse/parallel.h); the optimizer's worker rounds use
// it too (src/optim/worker_pool.cpp).
#include "jit/parallel.h"

#include <atomic>

#include "jit/session.h"

namespace optfuse {
namespace {

OpenMpRuntime g_omp;
std::atomic<bool> g_on{false};

struct Tasks {
  void* user_context;
  halide_task_t task;
  int min, size;
  uint8_t* closure;
  std::atomic<int> next{0};
  std::atomic<int> result{0};
};

// Each OpenMP thread takes the next task until none is left (a call's tasks are few and large:
// one or two per thread).
void run_tasks(void* data) {
  auto* t = static_cast<Tasks*>(data);
  for (int i; (i = t->next.fetch_add(1)) < t->size;) {
    int r = t->task(t->user_context, t->min + i, t->closure);
    int ok = 0;
    if (r != 0) t->result.compare_exchange_strong(ok, r);
  }
}

}  // namespace

void use_openmp_runtime(const OpenMpRuntime& omp) {
  g_on.store(false, std::memory_order_release);
  g_omp = omp;
  g_on.store(omp.parallel && omp.thread_num && omp.num_threads, std::memory_order_release);
}

const OpenMpRuntime& openmp_runtime() {
  static const OpenMpRuntime none;
  return g_on.load(std::memory_order_acquire) ? g_omp : none;
}

namespace jit {

int do_par_for(void* user_context, halide_task_t task, int min, int size, uint8_t* closure) {
  // One task runs on the calling thread: no pool to enter (Halide's job queue costs about a
  // microsecond and serializes concurrent callers), as a kernel's single-task loops do.
  if (size == 1) return task(user_context, min, closure);
  const Session& session = *static_cast<CallContext*>(user_context)->session;
  if (!g_on.load(std::memory_order_acquire) || size <= 1)
    return session.default_do_par_for()(user_context, task, min, size, closure);
  Tasks t{user_context, task, min, size, closure};
  const int threads = size < session.num_threads() ? size : session.num_threads();
  g_omp.parallel(&run_tasks, &t, static_cast<unsigned>(threads), 0);
  return t.result.load();
}

}  // namespace jit
}  // namespace optfuse
