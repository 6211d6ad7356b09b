/* optfuse C API: fused JIT optimizer steps behind opaque handles.
 *
 * Every function returns OPTFUSE_OK (0) or an error code; no exception crosses this boundary.
 * After an error, optfuse_last_error() returns its message (thread-local, valid until the next
 * call on this thread). A failed call changes nothing.
 *
 *   optfuse_engine* e;    optfuse_engine_create("host", 0, &e);
 *   optfuse_optimizer* o; optfuse_optimizer_create(e, "{\"type\":\"adamw\",\"lr\":1e-3}", &o);
 *   optfuse_optimizer_add_group(o, n, params, grads, numels, NULL, NULL, "{\"weight_decay\":0.1}");
 *   optfuse_optimizer_step(o);
 *
 * An engine must outlive the optimizers created from it. Buffers are owned by the caller (float32,
 * or bf16/f16 through the _typed functions) and must stay valid while the optimizer uses them.
 * They are host memory, except for an engine whose target uses CUDA ("host-cuda", ...): its
 * optimizers take CUDA device pointers (the _device functions below) and keep their state on the
 * device; see "Device tensors" below. */
#ifndef OPTFUSE_OPTFUSE_H
#define OPTFUSE_OPTFUSE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  OPTFUSE_OK = 0,
  OPTFUSE_ERR_INVALID = 1, /* bad input: the message names what is at fault */
  OPTFUSE_ERR_IO = 2,      /* a file could not be read or written */
  OPTFUSE_ERR_INTERNAL = 3 /* a bug in optfuse (please report) */
} optfuse_status;

typedef struct optfuse_engine optfuse_engine;
typedef struct optfuse_optimizer optfuse_optimizer;

typedef struct {
  int64_t compiles;       /* kernels compiled */
  int64_t lookups;        /* kernel requests */
  int64_t hits;           /* requests answered by an already-compiled kernel */
  double compile_seconds; /* time spent compiling */
  int64_t disk_hits;      /* objects read from the persistent cache instead of compiled */
} optfuse_counters;

const char* optfuse_last_error(void);
const char* optfuse_version(void);

/* target: "host" or a Halide target string (NULL = "host"); num_threads: 0 = all cores. Compiled
 * kernels go to the persistent cache at the default location ($OPTFUSE_CACHE_DIR, else
 * $XDG_CACHE_HOME/optfuse, else ~/.cache/optfuse), so a second process starts without compiling. */
int optfuse_engine_create(const char* target, int num_threads, optfuse_engine** out);
/* The same with the cache chosen: cache_dir is a directory, "" for the default location, or NULL
 * for memory only (kernels kept in this engine). */
int optfuse_engine_create_cached(const char* target, int num_threads, const char* cache_dir,
                                 optfuse_engine** out);
void optfuse_engine_destroy(optfuse_engine* engine);
int optfuse_engine_counters(const optfuse_engine* engine, optfuse_counters* out);

/* config_json: {"type": one of "sgd", "adam", "adamw", "adagrad", "rmsprop", "adamax", "nadam",
 * "radam", "adadelta", "asgd", "rprop", "adafactor" (torch.optim class names, any case; a param
 * of 2 or more dims needs its shape: Adafactor factors over its last two), "muon" or "lion",
 * "lamb", "lars", and that optimizer's torch.optim options as defaults}. */
int optfuse_optimizer_create(optfuse_engine* engine, const char* config_json,
                             optfuse_optimizer** out);
void optfuse_optimizer_destroy(optfuse_optimizer* opt);

/* Adds a group of n tensors: params[i] and grads[i] hold numels[i] floats. shapes/ndims may be
 * NULL (1-D); when given, shapes[i] has ndims[i] dims whose product must equal numels[i].
 * overrides_json may be NULL, else a JSON object of per-group options. */
int optfuse_optimizer_add_group(optfuse_optimizer* opt, size_t n, float* const* params,
                                float* const* grads, const int64_t* numels,
                                const int64_t* const* shapes, const int* ndims,
                                const char* overrides_json);

/* Element types of params and grads (mixed precision): bf16 and f16 buffers hold raw 16-bit
 * words (uint16_t); f64 params take f64 grads and keep f64 state (the step computed in double). */
typedef enum { OPTFUSE_F32 = 0, OPTFUSE_BF16 = 1, OPTFUSE_F16 = 2, OPTFUSE_F64 = 3 } optfuse_dtype;

/* As optfuse_optimizer_add_group, with every param of the group in param_dtype and every grad in
 * grad_dtype. A 16-bit param gets an f32 master copy inside the optimizer unless the group says
 * "master_weights": false (torch's way: no copy, state in the param's dtype; see optim.h); the
 * per-group options "state_dtype" ("f32", "bf16" or "int8": 8-bit codes with one f32 scale per
 * "block_size" elements, for tensors of at least "min_8bit_size"; see optim.h),
 * "master_weights", "stochastic_rounding" (bf16 params) and "rounding_seed" go in overrides_json
 * (or the optimizer config). */
int optfuse_optimizer_add_group_typed(optfuse_optimizer* opt, size_t n, void* const* params,
                                      optfuse_dtype param_dtype, void* const* grads,
                                      optfuse_dtype grad_dtype, const int64_t* numels,
                                      const int64_t* const* shapes, const int* ndims,
                                      const char* overrides_json);

/* Device tensors (C++: optfuse::Optimizer, "Device tensors"). For an optimizer of an engine with a
 * CUDA target ("host-cuda", ...), params[i] and grads[i] are CUdeviceptr values cast to void*
 * (e.g. (void*)tensor.data_ptr() from PyTorch), 16-byte aligned and valid in device 0's primary
 * context (the one the CUDA runtime, and so PyTorch, uses). The optimizer's state is allocated on
 * the device at the first step and freed by optfuse_optimizer_destroy; a step launches its kernels
 * on the stream given to optfuse_optimizer_step_stream (NULL: the default stream) and returns
 * without copying anything between host and device. save / load copy the state to / from the file
 * after waiting for the device. Host pointers to such an optimizer, device pointers to a CPU
 * engine's optimizer, and a mix of both are errors (OPTFUSE_ERR_INVALID, message naming the group
 * and tensor), as are the features not yet available on the device: clipping, loss scaling,
 * grad_centralization, LAMB, LARS, Adafactor, sparse gradients, bf16 params and "state_dtype":
 * "bf16" or "int8" (f16 params and 16-bit grads work). */
int optfuse_optimizer_add_group_device(optfuse_optimizer* opt, size_t n, void* const* params,
                                       optfuse_dtype param_dtype, void* const* grads,
                                       optfuse_dtype grad_dtype, const int64_t* numels,
                                       const int64_t* const* shapes, const int* ndims,
                                       const char* overrides_json);
/* optfuse_optimizer_set_grad_typed for a device gradient. */
int optfuse_optimizer_set_grad_device(optfuse_optimizer* opt, size_t group, size_t index,
                                      void* grad, optfuse_dtype dtype, int64_t numel);

int optfuse_optimizer_step(optfuse_optimizer* opt);

/* What one step did (C++: optfuse::StepResult). Clipping, loss scaling and gradient accumulation
 * are options of the optimizer config: {"max_grad_norm": 1.0, "norm_type": 2 or "inf",
 * "error_if_nonfinite": false}, {"loss_scale": "dynamic" or S, "init_scale", "growth_factor",
 * "backoff_factor", "growth_interval"}, {"accumulation_steps": k, "accumulation": "mean"|"sum"}. */
typedef enum {
  OPTFUSE_STEP_APPLIED = 0,          /* params and state were updated */
  OPTFUSE_STEP_ACCUMULATED = 1,      /* micro-step 1..k-1: grads added to the accumulation buffer */
  OPTFUSE_STEP_SKIPPED_NONFINITE = 2 /* loss scaling: a grad held inf/nan, nothing changed */
} optfuse_step_outcome;

typedef struct {
  int outcome;        /* an optfuse_step_outcome */
  int64_t micro_step; /* 1..accumulation_steps */
  int has_total_norm; /* 1 when total_norm was computed (clipping or loss scaling on) */
  double total_norm;  /* norm of the unscaled gradients over all groups (inf/nan if a grad is) */
  double clip_coef;   /* the clip factor applied (1 when not clipped) */
  double loss_scale;  /* the S this step's grads were divided by */
  double next_loss_scale; /* the S for the next backward */
} optfuse_step_result;

/* optfuse_optimizer_step that also says what the step did; out may be NULL. */
int optfuse_optimizer_step_ex(optfuse_optimizer* opt, optfuse_step_result* out);
/* optfuse_optimizer_step_ex launching on a CUstream (device tensors; e.g.
 * torch.cuda.current_stream().cuda_stream): synchronize it before reading the params on the host.
 * cuda_stream must be NULL for a CPU engine's optimizer. */
int optfuse_optimizer_step_stream(optfuse_optimizer* opt, void* cuda_stream,
                                  optfuse_step_result* out);
/* The loss scale to multiply the next loss by (1 without loss scaling). */
int optfuse_optimizer_loss_scale(const optfuse_optimizer* opt, double* out);

/* Sets a numeric option of one group (e.g. "lr"); optfuse_optimizer_set_option_json for others
 * ("betas": "[0.9,0.99]", "amsgrad": "true"). */
int optfuse_optimizer_set_hyper(optfuse_optimizer* opt, size_t group, const char* name,
                                double value);
int optfuse_optimizer_set_option_json(optfuse_optimizer* opt, size_t group, const char* name,
                                      const char* value_json);
int optfuse_optimizer_get_hyper(const optfuse_optimizer* opt, size_t group, const char* name,
                                double* out);
int optfuse_optimizer_set_grad(optfuse_optimizer* opt, size_t group, size_t index, float* grad,
                               int64_t numel);
/* The same for a grad of any supported dtype (it must match the tensor's current grad dtype). */
int optfuse_optimizer_set_grad_typed(optfuse_optimizer* opt, size_t group, size_t index, void* grad,
                                     optfuse_dtype dtype, int64_t numel);

/* Row-sparse gradient (only "sparseadam" / "lazyadam", as torch.optim.SparseAdam): the param is
 * viewed as [rows, row_len] (row_len = numel / shape[0], 1 without a shape); `rows` lists the
 * nnz_rows rows present (any order, no repeats) and `values` their nnz_rows * row_len float32
 * gradients, row after row (caller-owned, read at each step until replaced). */
int optfuse_optimizer_set_sparse_grad(optfuse_optimizer* opt, size_t group, size_t index,
                                      const int64_t* rows, size_t nnz_rows, float* values,
                                      int64_t num_values);

int optfuse_optimizer_save(const optfuse_optimizer* opt, const char* path);
int optfuse_optimizer_load(optfuse_optimizer* opt, const char* path);

#ifdef __cplusplus
}
#endif

#endif /* OPTFUSE_OPTFUSE_H */
