#pragma once
// The runtime's halide_do_par_for replacement (parallel.cpp): a kernel's tasks on the OpenMP
// runtime of include/optfuse/parallel.h when one is set, else on the session runtime's own pool;
// a loop of one task on the calling thread (staged kernels' stages rely on it, lower/staged.h).
#include <HalideRuntime.h>

#include "optfuse/parallel.h"

namespace optfuse::jit {

int do_par_for(void* user_context, halide_task_t task, int min, int size, uint8_t* closure);

}  // namespace optfuse::jit
