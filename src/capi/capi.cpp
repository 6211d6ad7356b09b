// The C API: a thin shell over the C++ API that turns exceptions into status codes.
#include <exception>
#include <new>
#include <string>

#include "optfuse/optfuse.h"
#include "optfuse/optfuse.hpp"

struct optfuse_engine {
  optfuse::Engine engine;
  explicit optfuse_engine(optfuse::EngineOptions o) : engine(std::move(o)) {}
};
struct optfuse_optimizer {
  std::unique_ptr<optfuse::Optimizer> opt;
};

namespace {

thread_local std::string g_last_error;

int fail(int code, const std::string& message) {
  g_last_error = message;
  return code;
}

// Runs `f`, mapping every exception to a status code and message.
template <typename F>
int guarded(F&& f) {
  try {
    f();
    g_last_error.clear();
    return OPTFUSE_OK;
  } catch (const optfuse::IoError& e) {
    return fail(OPTFUSE_ERR_IO, e.what());
  } catch (const optfuse::Error& e) {
    std::string what = e.what();
    if (what.rfind("internal error", 0) == 0) return fail(OPTFUSE_ERR_INTERNAL, what);
    return fail(OPTFUSE_ERR_INVALID, what);
  } catch (const nlohmann::json::exception& e) {
    return fail(OPTFUSE_ERR_INVALID, std::string("invalid JSON: ") + e.what());
  } catch (const std::bad_alloc&) {
    return fail(OPTFUSE_ERR_INTERNAL, "out of memory");
  } catch (const std::exception& e) {
    return fail(OPTFUSE_ERR_INTERNAL, std::string("internal error: ") + e.what());
  } catch (...) {
    return fail(OPTFUSE_ERR_INTERNAL, "internal error: unknown exception");
  }
}

#define OPTFUSE_REQUIRE(ptr)                                                 \
  do {                                                                       \
    if ((ptr) == nullptr) return fail(OPTFUSE_ERR_INVALID, #ptr " is NULL"); \
  } while (0)

optfuse::Options parse_json(const char* text, const char* what) {
  if (text == nullptr || *text == '\0') return optfuse::Options::object();
  optfuse::Options j = optfuse::Options::parse(text, nullptr, false);
  if (j.is_discarded()) throw optfuse::Error(std::string(what) + " is not valid JSON: " + text);
  return j;
}

}  // namespace

extern "C" {

const char* optfuse_last_error(void) { return g_last_error.c_str(); }
const char* optfuse_version(void) { return OPTFUSE_VERSION; }

int optfuse_engine_create(const char* target, int num_threads, optfuse_engine** out) {
  return optfuse_engine_create_cached(target, num_threads, "", out);
}

int optfuse_engine_create_cached(const char* target, int num_threads, const char* cache_dir,
                                 optfuse_engine** out) {
  OPTFUSE_REQUIRE(out);
  *out = nullptr;
  if (num_threads < 0)
    return fail(OPTFUSE_ERR_INVALID,
                "num_threads must be >= 0 (0 = all cores), got " + std::to_string(num_threads));
  return guarded([&] {
    optfuse::EngineOptions o;
    if (target) o.target = target;
    o.num_threads = num_threads;
    if (cache_dir) o.cache_dir = cache_dir;  // "" = default_cache_dir()
    o.memory_only = !cache_dir;
    *out = new optfuse_engine(std::move(o));
  });
}

void optfuse_engine_destroy(optfuse_engine* engine) { delete engine; }

int optfuse_engine_counters(const optfuse_engine* engine, optfuse_counters* out) {
  OPTFUSE_REQUIRE(engine);
  OPTFUSE_REQUIRE(out);
  return guarded([&] {
    optfuse::EngineCounters c = engine->engine.counters();
    *out = {c.compiles, c.lookups, c.hits, c.compile_seconds, c.disk_hits};
  });
}

int optfuse_optimizer_create(optfuse_engine* engine, const char* config_json,
                             optfuse_optimizer** out) {
  OPTFUSE_REQUIRE(engine);
  OPTFUSE_REQUIRE(config_json);
  OPTFUSE_REQUIRE(out);
  *out = nullptr;
  return guarded([&] {
    auto opt = optfuse::Optimizer::create(engine->engine, parse_json(config_json, "config"));
    *out = new optfuse_optimizer{std::move(opt)};
  });
}

void optfuse_optimizer_destroy(optfuse_optimizer* opt) { delete opt; }

namespace {

// The C dtype codes (optfuse.h) as optfuse::DType; Error naming the code otherwise.
optfuse::DType c_dtype(int code, const char* what) {
  switch (code) {
    case OPTFUSE_F32:
      return optfuse::DType::F32;
    case OPTFUSE_BF16:
      return optfuse::DType::BF16;
    case OPTFUSE_F16:
      return optfuse::DType::F16;
    case OPTFUSE_F64:
      return optfuse::DType::F64;
  }
  throw optfuse::Error(std::string(what) + " dtype code " + std::to_string(code) +
                       " is not one of OPTFUSE_F32 (0), OPTFUSE_BF16 (1), OPTFUSE_F16 (2), " +
                       "OPTFUSE_F64 (3)");
}

int add_group(optfuse_optimizer* opt, size_t n, void* const* params, int param_dtype,
              void* const* grads, int grad_dtype, const int64_t* numels,
              const int64_t* const* shapes, const int* ndims, const char* overrides_json,
              optfuse::Memory memory = optfuse::Memory::Host) {
  OPTFUSE_REQUIRE(opt);
  if (n > 0) {
    OPTFUSE_REQUIRE(params);
    OPTFUSE_REQUIRE(grads);
    OPTFUSE_REQUIRE(numels);
  }
  if ((shapes == nullptr) != (ndims == nullptr))
    return fail(OPTFUSE_ERR_INVALID, "shapes and ndims must both be given or both be NULL");
  return guarded([&] {
    std::vector<optfuse::ParamRef> refs(n);
    for (size_t i = 0; i < n; ++i) {
      refs[i].param = {params[i], numels[i], {}, c_dtype(param_dtype, "param"), memory};
      refs[i].grad = {grads[i], numels[i], {}, c_dtype(grad_dtype, "grad"), memory};
      if (shapes) {
        if (ndims[i] < 0 || (ndims[i] > 0 && shapes[i] == nullptr))
          throw optfuse::Error("tensor " + std::to_string(i) + ": shape is NULL or ndims < 0");
        if (ndims[i] == 0 && numels[i] != 1)
          throw optfuse::Error("tensor " + std::to_string(i) +
                               ": a 0-dim tensor has 1 element, numel is " +
                               std::to_string(numels[i]));
        refs[i].param.shape.assign(shapes[i], shapes[i] + ndims[i]);
        refs[i].grad.shape = refs[i].param.shape;
      }
    }
    opt->opt->add_param_group(refs, parse_json(overrides_json, "overrides"));
  });
}

}  // namespace

int optfuse_optimizer_add_group(optfuse_optimizer* opt, size_t n, float* const* params,
                                float* const* grads, const int64_t* numels,
                                const int64_t* const* shapes, const int* ndims,
                                const char* overrides_json) {
  return add_group(opt, n, reinterpret_cast<void* const*>(params), OPTFUSE_F32,
                   reinterpret_cast<void* const*>(grads), OPTFUSE_F32, numels, shapes, ndims,
                   overrides_json);
}

int optfuse_optimizer_add_group_typed(optfuse_optimizer* opt, size_t n, void* const* params,
                                      optfuse_dtype param_dtype, void* const* grads,
                                      optfuse_dtype grad_dtype, const int64_t* numels,
                                      const int64_t* const* shapes, const int* ndims,
                                      const char* overrides_json) {
  return add_group(opt, n, params, param_dtype, grads, grad_dtype, numels, shapes, ndims,
                   overrides_json);
}

int optfuse_optimizer_add_group_device(optfuse_optimizer* opt, size_t n, void* const* params,
                                       optfuse_dtype param_dtype, void* const* grads,
                                       optfuse_dtype grad_dtype, const int64_t* numels,
                                       const int64_t* const* shapes, const int* ndims,
                                       const char* overrides_json) {
  return add_group(opt, n, params, param_dtype, grads, grad_dtype, numels, shapes, ndims,
                   overrides_json, optfuse::Memory::Cuda);
}

int optfuse_optimizer_step(optfuse_optimizer* opt) {
  OPTFUSE_REQUIRE(opt);
  return guarded([&] { opt->opt->step(); });
}

int optfuse_optimizer_step_ex(optfuse_optimizer* opt, optfuse_step_result* out) {
  return optfuse_optimizer_step_stream(opt, nullptr, out);
}

int optfuse_optimizer_step_stream(optfuse_optimizer* opt, void* cuda_stream,
                                  optfuse_step_result* out) {
  OPTFUSE_REQUIRE(opt);
  return guarded([&] {
    optfuse::StepArgs args;
    args.cuda_stream = cuda_stream;
    optfuse::StepResult r = opt->opt->step(args);
    if (!out) return;
    using O = optfuse::StepResult::Outcome;
    out->outcome = r.outcome == O::Applied       ? OPTFUSE_STEP_APPLIED
                   : r.outcome == O::Accumulated ? OPTFUSE_STEP_ACCUMULATED
                                                 : OPTFUSE_STEP_SKIPPED_NONFINITE;
    out->micro_step = r.micro_step;
    out->has_total_norm = r.has_total_norm ? 1 : 0;
    out->total_norm = r.total_norm;
    out->clip_coef = r.clip_coef;
    out->loss_scale = r.loss_scale;
    out->next_loss_scale = r.next_loss_scale;
  });
}

int optfuse_optimizer_loss_scale(const optfuse_optimizer* opt, double* out) {
  OPTFUSE_REQUIRE(opt);
  OPTFUSE_REQUIRE(out);
  return guarded([&] { *out = opt->opt->loss_scale(); });
}

int optfuse_optimizer_set_hyper(optfuse_optimizer* opt, size_t group, const char* name,
                                double value) {
  OPTFUSE_REQUIRE(opt);
  OPTFUSE_REQUIRE(name);
  return guarded([&] { opt->opt->set(group, name, value); });
}

int optfuse_optimizer_set_option_json(optfuse_optimizer* opt, size_t group, const char* name,
                                      const char* value_json) {
  OPTFUSE_REQUIRE(opt);
  OPTFUSE_REQUIRE(name);
  OPTFUSE_REQUIRE(value_json);
  return guarded([&] { opt->opt->set(group, name, parse_json(value_json, "value")); });
}

int optfuse_optimizer_get_hyper(const optfuse_optimizer* opt, size_t group, const char* name,
                                double* out) {
  OPTFUSE_REQUIRE(opt);
  OPTFUSE_REQUIRE(name);
  OPTFUSE_REQUIRE(out);
  return guarded([&] {
    optfuse::Options v = opt->opt->get(group, name);
    if (!v.is_number())
      throw optfuse::Error(std::string("option '") + name + "' is not a number: " + v.dump());
    *out = v.get<double>();
  });
}

int optfuse_optimizer_set_grad(optfuse_optimizer* opt, size_t group, size_t index, float* grad,
                               int64_t numel) {
  OPTFUSE_REQUIRE(opt);
  return guarded([&] { opt->opt->set_grad(group, index, {grad, numel, {}}); });
}

int optfuse_optimizer_set_grad_typed(optfuse_optimizer* opt, size_t group, size_t index, void* grad,
                                     optfuse_dtype dtype, int64_t numel) {
  OPTFUSE_REQUIRE(opt);
  return guarded([&] {
    opt->opt->set_grad(group, index, {grad, numel, {}, c_dtype(dtype, "grad")});
  });
}

int optfuse_optimizer_set_grad_device(optfuse_optimizer* opt, size_t group, size_t index,
                                      void* grad, optfuse_dtype dtype, int64_t numel) {
  OPTFUSE_REQUIRE(opt);
  return guarded([&] {
    opt->opt->set_grad(group, index,
                       {grad, numel, {}, c_dtype(dtype, "grad"), optfuse::Memory::Cuda});
  });
}

int optfuse_optimizer_set_sparse_grad(optfuse_optimizer* opt, size_t group, size_t index,
                                      const int64_t* rows, size_t nnz_rows, float* values,
                                      int64_t num_values) {
  OPTFUSE_REQUIRE(opt);
  if (nnz_rows > 0) OPTFUSE_REQUIRE(rows);
  return guarded([&] {
    std::vector<int64_t> r(rows, rows + nnz_rows);
    opt->opt->set_sparse_grad(group, index, r, {values, num_values, {}});
  });
}

int optfuse_optimizer_save(const optfuse_optimizer* opt, const char* path) {
  OPTFUSE_REQUIRE(opt);
  OPTFUSE_REQUIRE(path);
  return guarded([&] { opt->opt->save_state(path); });
}

int optfuse_optimizer_load(optfuse_optimizer* opt, const char* path) {
  OPTFUSE_REQUIRE(opt);
  OPTFUSE_REQUIRE(path);
  return guarded([&] { opt->opt->load_state(path); });
}

}  // extern "C"
