#include "lower/schedule.h"

#include "optfuse/error.h"

namespace optfuse::lower {

void apply_schedule(PipelineFuncs& f, const Schedule& s, const Halide::Target& target) {
  if (target.has_gpu_feature())
    throw Error("target " + target.to_string() +
                ": GPU schedules are not implemented yet (use a CPU target such as \"host\")");
  apply_cpu_schedule(f, s);
}

void apply_cpu_schedule(PipelineFuncs& f, const Schedule& s) {
  using Halide::TailStrategy;
  Halide::Var xvo("xvo"), xv("xv"), xo("xo"), xi("xi");
  // Vectors first, then chunks of whole vectors: only the last vector of the array is ragged, so
  // the predicated tail exists once, not once per task.
  Halide::Expr vectors_per_task = Halide::max(f.chunk / s.vector_width, 1);
  f.out.split(f.x, xvo, xv, s.vector_width, TailStrategy::GuardWithIf)
      .vectorize(xv)
      .split(xvo, xo, xi, vectors_per_task, TailStrategy::GuardWithIf)
      .parallel(xo);
  // All inputs of a vector are loaded before any output of it is stored: in place is safe by
  // construction rather than by LLVM's alias analysis.
  if (f.load.defined()) f.load.compute_at(f.out, xv);
  // Scalar-only subexpressions: once per call, outside the parallel loop.
  if (f.uniforms.defined()) f.uniforms.compute_root();
}

}  // namespace optfuse::lower
