#pragma once
// Where optfuse's parallel loops run: on its own threads (Halide's pool for a large tensor's
// chunks, a worker pool for many small tensors), or on an OpenMP runtime the process already
// has. A framework that runs its own OpenMP threads (PyTorch's CPU ops do) leaves them spinning
// after each of its parallel regions, so on a machine with few cores optfuse's own threads wait
// for a core while those spin: a cache-resident AdamW step right after torch's ops took 2.8x as
// long (bench/README.md). Handing optfuse the same OpenMP runtime puts its loops on those
// threads. The Python package does this for torch's libgomp (python/optfuse/_engine.py).
namespace optfuse {

// The entry points of a GNU OpenMP (libgomp) runtime, as loaded in this process.
struct OpenMpRuntime {
  // GOMP_parallel: runs fn(data) on `threads` threads (the caller is thread 0), returns after all.
  void (*parallel)(void (*fn)(void*), void* data, unsigned threads, unsigned flags) = nullptr;
  int (*thread_num)() = nullptr;   // omp_get_thread_num
  int (*num_threads)() = nullptr;  // omp_get_num_threads
};

// From now on every kernel's parallel loop and step()'s small-tensor rounds run on `omp`'s
// threads (the engine's thread count each); all-null entries return to optfuse's own threads.
// Set it before steps run, not during one.
void use_openmp_runtime(const OpenMpRuntime& omp);
const OpenMpRuntime& openmp_runtime();  // all null unless set

}  // namespace optfuse
