#include "lower/schedule.h"

#include <algorithm>

#include "optfuse/error.h"

namespace optfuse::lower {

void apply_schedule(PipelineFuncs& f, const Schedule& s, const Halide::Target& target) {
  if (target.has_feature(Halide::Target::CUDA)) return apply_cuda_schedule(f, s);
  if (target.has_gpu_feature())
    throw Error("target " + target.to_string() +
                ": only the CUDA GPU backend is supported (use \"host-cuda\" or a CPU target)");
  apply_cpu_schedule(f, s);
}

void apply_cpu_schedule(PipelineFuncs& f, const Schedule& s) {
  // No prefetches in reduction prologues yet: their loads are clamped (not a plain dense ramp,
  // which is all lower/prefetch.cpp recognizes).
  for (WholeReduction& r : f.whole) schedule_whole(r, s.vector_width);
  if (f.per_row) return apply_cpu_row_schedule(f, s);
  if (f.out.defined()) apply_cpu_flat_schedule(f, s);
  // Scalar-only subexpressions: once per call, outside the parallel loop.
  if (f.uniforms.defined()) f.uniforms.compute_root();
}

void apply_cpu_flat_schedule(PipelineFuncs& f, const Schedule& s) {
  using Halide::TailStrategy;
  Halide::Var xvo("xvo"), xv("xv"), xo("xo"), xi("xi");
  // Vectors first, then chunks of whole vectors: only the last vector of the array is ragged, so
  // the predicated tail exists once, not once per task.
  Halide::Expr vectors_per_task = Halide::max(f.chunk / s.vector_width, 1);
  // One task on the calling thread, never entering Halide's thread pool (whose job queue costs
  // about a microsecond and serializes concurrent callers): for chunk < 0, callers that run many
  // such calls in parallel themselves (KernelCall::serial: Optimizer::step's one round over
  // (tensor, chunk) pairs), and for a call that fits one task. Its loop has a name of its own, so
  // that it gets the parallel tasks' prefetches; its vector Var is theirs (`load` is computed at
  // it). (Calls that fit one task had a loop of their own, a third copy of the loop to compile:
  // a tenth of a cold compile. jit::do_par_for runs one task inline anyway.)
  Halide::Expr extent = f.out.output_buffers()[0].dim(0).extent();
  Halide::Var xso("xso");
  Halide::Stage streaming = f.out.specialize(f.chunk < 0 || extent <= f.chunk);
  streaming.split(f.x, xso, xv, s.vector_width, TailStrategy::GuardWithIf).vectorize(xv);
  f.out.split(f.x, xvo, xv, s.vector_width, TailStrategy::GuardWithIf)
      .vectorize(xv)
      .split(xvo, xo, xi, vectors_per_task, TailStrategy::GuardWithIf)
      .parallel(xo);
  // Optional unroll of the vector loop (Schedule::unroll; chunk is a multiple of vector_width *
  // unroll, so only the array's last step is ragged). Not applied at 1: default keys and code
  // stay as they were.
  if (s.unroll > 1) {
    Halide::Var xu("xu"), xs("xs");
    Halide::Var xsu("xsu"), xss("xss");
    streaming.split(xso, xss, xsu, s.unroll, TailStrategy::GuardWithIf).unroll(xsu);
    f.out.split(xi, xs, xu, s.unroll, TailStrategy::GuardWithIf).unroll(xu);
  }
  // Each specialization copies its stage's schedule so far (not the other specializations):
  // so every stage gets its own, after its splits; the default stage's comes after the others.
  for (const Halide::Expr& c : f.cases) {
    streaming.specialize(c);
    f.out.specialize(c);
  }
  // All inputs of a vector are loaded before any output of it is stored: in place is safe by
  // construction rather than by LLVM's alias analysis.
  if (f.load.defined()) f.load.compute_at(f.out, xv);
  if (s.prefetch > 0 || s.prefetch_l2 > 0) {
    f.prefetch_loops.push_back("." + xi.name());
    f.prefetch_loops.push_back("." + xso.name());
  }
}

void apply_cpu_row_schedule(PipelineFuncs& f, const Schedule& s) {
  using Halide::TailStrategy;
  if (!f.out.defined()) internal_error("lower: a per-row graph without outputs");
  Halide::Var xvo("xvo"), xv("xv"), yo("yo"), yi("yi");
  // Tasks of whole rows, about `chunk` elements each; in a row, the row reductions first (lanes
  // of vectors), then the update over the row (vectors, one predicated ragged vector per row).
  // Rows that fit L2 are read from cache by the update: about one pass over memory.
  Halide::Expr cols = f.out.output_buffers()[0].dim(0).extent();
  Halide::Expr rows = f.out.output_buffers()[0].dim(1).extent();
  Halide::Expr rows_per_task = Halide::max(f.chunk / cols, 1);
  Halide::Stage single = f.out.specialize(rows <= rows_per_task);
  single.split(f.x, xvo, xv, s.vector_width, TailStrategy::GuardWithIf)
      .vectorize(xv)
      .split(f.y, yo, yi, rows_per_task, TailStrategy::GuardWithIf);
  f.out.split(f.x, xvo, xv, s.vector_width, TailStrategy::GuardWithIf)
      .vectorize(xv)
      .split(f.y, yo, yi, rows_per_task, TailStrategy::GuardWithIf)
      .parallel(yo);
  for (const Halide::Expr& c : f.cases) {  // as in the flat schedule
    single.specialize(c);
    f.out.specialize(c);
  }
  for (RowReduction& r : f.rows) schedule_rows(r, Halide::LoopLevel(f.out, yi), s.vector_width);
  for (Halide::Func& v : f.row_values)
    if (v.defined()) v.compute_at(f.out, yi).bound_extent(f.y, 1);
  // One row of it, on the stack (a block of at most kMaxRowStateCols elements).
  if (f.fresh.defined())
    f.fresh.compute_at(f.out, yi)
        .vectorize(f.x, s.vector_width, TailStrategy::GuardWithIf)
        .bound_storage(f.x, static_cast<int>(kMaxRowStateCols))
        .bound_storage(f.y, 1);
  // Row state's new values: the same task split over rows, each row's computed in the update's
  // row loop (compute_with), so it reads the row reductions computed there once.
  // Their buffers are constrained to out's rows (Kernel::run passes them so): otherwise the fused
  // loop's row range is the union of both, and every row stage is allocated on the heap, per row,
  // at a size known only at run time.
  if (f.row_out.defined()) {
    f.row_out.split(f.y, yo, yi, rows_per_task, TailStrategy::GuardWithIf).parallel(yo);
    f.row_out.compute_with(f.out, yi);
    // (Only the first buffer of a Tuple may be constrained: the others share its bounds.)
    f.row_out.output_buffers()[0].dim(0).set_bounds(f.out.output_buffers()[0].dim(1).min(), rows);
  }
  if (f.load.defined()) f.load.compute_at(f.out, xv);
  // Each row is read from memory by its reductions, then from cache by the update: prefetches
  // in the row loop run ahead into the rest of the row and on into the task's next row.
  if (s.prefetch > 0 || s.prefetch_l2 > 0) f.prefetch_loops.push_back("." + yi.name());
  if (f.uniforms.defined()) f.uniforms.compute_root();
}

void apply_cuda_schedule(PipelineFuncs& f, const Schedule& s) {
  using Halide::TailStrategy;
  // Reductions: kernels of their own before `out` (reduce.h); `out` reads their totals / row
  // values from device memory. `results` (a host Func: Halide copies the few f64 totals it reads
  // back to the host) is left unscheduled.
  for (WholeReduction& r : f.whole) schedule_gpu(r.gpu);
  for (RowReduction& r : f.rows) schedule_gpu(r.gpu);
  // 128-bit accesses need an alignment the kernel can prove: every buffer starts at element 0
  // (Kernel::run builds them so; this removes the min differences from every index) and its data
  // at a multiple of one vector (capped at 16 bytes; cuMemAlloc gives 256). Without this, LLVM
  // NVPTX splits each vector into scalar ld.global.f32. Halide asserts the host pointer's
  // alignment; Kernel::run checks device pointers. (The min can only be set on the first output
  // buffer: Halide gives the others the same.)
  auto constrain = [&](Halide::OutputImageParam b, bool set_min) {
    int bytes = b.type().bytes() * s.vector_width;
    int align = 1;
    while (align < 16 && bytes % (2 * align) == 0) align *= 2;
    if (set_min) b.dim(0).set_min(0);
    b.set_host_alignment(std::max(align, b.type().bytes()));
  };
  for (Halide::ImageParam& in : f.inputs) constrain(in, true);
  if (!f.out.defined()) return;  // a statistics kernel: results only
  std::vector<Halide::OutputImageParam> outs = f.out.output_buffers();
  for (size_t i = 0; i < outs.size(); ++i) constrain(outs[i], i == 0);
  Halide::Var xt("xt"), xv("xv"), bx("bx"), tx("tx"), xo("xo");
  if (f.per_row) {
    // One block per row (y), its threads over the row's vectors, striding when the row is longer
    // than the block (consecutive threads, consecutive vectors); both splits GuardWithIf. The
    // row's reductions were computed by their own kernel, read here once per thread.
    f.out.split(f.x, xt, xv, s.vector_width, TailStrategy::GuardWithIf)
        .vectorize(xv)
        .split(xt, xo, tx, s.gpu_block, TailStrategy::GuardWithIf)
        .reorder(xv, xo, tx, f.y)
        .gpu_blocks(f.y)
        .gpu_threads(tx);
    if (f.load.defined()) f.load.compute_at(f.out, xv);
    return;
  }
  // Thread t of the grid handles elements [t*vw, t*vw + vw): one vw-lane vector per tensor (4 f32
  // lanes: ld.global.v4.f32; Halide 14 + LLVM 14 store them as two st.global.u64, see
  // src/lower/README.md). The grid is ceil(n / (gpu_block * vw)) blocks, derived from the
  // output extent at each call, so any n is covered. Both splits guard their tail (GuardWithIf):
  // threads past the end do nothing and the last vector is predicated; no element is computed
  // twice (ShiftInwards would, breaking in-place updates) and no memory past n is touched.
  f.out.split(f.x, xt, xv, s.vector_width, TailStrategy::GuardWithIf)
      .vectorize(xv)
      .gpu_tile(xt, bx, tx, s.gpu_block, TailStrategy::GuardWithIf);
  // Each thread loads all of its inputs before it stores any output; threads never share
  // elements, so in-place updates stay safe.
  if (f.load.defined()) f.load.compute_at(f.out, xv);
  // Scalar-only subexpressions are inlined into the kernel (uniforms is left compute_inline), so
  // each thread recomputes them from the scalar Params, which Halide passes to the kernel by
  // value. compute_root would compute them on the host into a buffer that Halide then copies to
  // the device on every call (a hidden host->device copy and a synchronization per step);
  // per-thread scalar math is free on a kernel that is bound by memory bandwidth.
}

}  // namespace optfuse::lower
