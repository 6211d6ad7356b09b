#pragma once
// Schedules for the lowered pipeline (internal; includes Halide.h — src/lower and src/jit only).
#include <Halide.h>

#include "optfuse/engine.h"

namespace optfuse::lower {

// The Funcs of one lowered pipeline (see lower.h); `load` and `uniforms` may be undefined (no
// tensor inputs, no uniform subexpressions).
struct PipelineFuncs {
  Halide::Func out, load, uniforms;
  Halide::Var x;
  Halide::Expr chunk;  // runtime task size in elements, a multiple of the vector width
};

// The branch point between targets: CPU targets get apply_cpu_schedule; GPU targets (cuda, ...)
// will get a gpu_tile schedule here and throw Error until then.
void apply_schedule(PipelineFuncs& f, const Schedule& s, const Halide::Target& target);

// Parallel chunks of `chunk` elements (few large tasks: Halide's pool costs ~0.1 us per task and
// ~30 us per worker wake-up), each a loop of `vector_width`-lane vectors; the one ragged vector at
// the end is predicated (GuardWithIf: in-place updates must not recompute an element, as
// ShiftInwards would, nor touch memory past n, as RoundUp would).
void apply_cpu_schedule(PipelineFuncs& f, const Schedule& s);

}  // namespace optfuse::lower
