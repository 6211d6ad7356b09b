#include "jit/session.h"

#include <string>

#include "jit/cuda_hooks.h"
#include "jit/parallel.h"
#include "optfuse/error.h"

namespace optfuse::jit {
namespace {

// Runtime errors raised without a call context (none are expected) go to a thread-local buffer.
thread_local std::string orphan_error;

}  // namespace

void capture_halide_error(void* user_context, const char* message) {
  std::string& sink = user_context ? static_cast<CallContext*>(user_context)->error : orphan_error;
  if (!sink.empty()) sink += "; ";
  sink += message ? message : "(no message)";
  while (!sink.empty() && (sink.back() == '\n' || sink.back() == ' ')) sink.pop_back();
}

namespace {

using ErrorHandler = void (*)(void*, const char*);

template <typename Handler>
void install(Jit& jit, const char* setter, Handler handler) {
  reinterpret_cast<Handler (*)(Handler)>(jit.lookup(setter))(handler);
}

}  // namespace

Session::Session(std::unique_ptr<Jit> jit, int num_threads)
    : jit_(std::move(jit)), num_threads_(num_threads) {}

const std::vector<std::string>& runtime_entry_points(bool cuda) {
  static const std::vector<std::string> cpu = {"halide_set_num_threads", "halide_set_error_handler",
                                               "halide_shutdown_thread_pool",
                                               "halide_set_custom_do_par_for"};
  static const std::vector<std::string> gpu = [] {
    std::vector<std::string> all = cpu;
    for (const char* s : {"halide_set_cuda_acquire_context", "halide_set_cuda_release_context",
                          "halide_set_cuda_get_stream", "halide_cuda_device_interface",
                          "halide_reuse_device_allocations"})
      all.push_back(s);
    return all;
  }();
  return cuda ? gpu : cpu;
}

std::unique_ptr<Jit> link_runtime(const std::vector<char>& runtime_object, bool cuda) {
  auto jit = Jit::create();
  const std::vector<std::string>& symbols = runtime_entry_points(cuda);
  jit->link(runtime_object, "halide_runtime.o", symbols[0]);
  for (const std::string& symbol : symbols) try {
      jit->lookup(symbol);
    } catch (const Error& e) {
      throw LinkError(std::string("cannot link object halide_runtime.o: ") + e.what());
    }
  return jit;
}

std::shared_ptr<Session> Session::create(const std::vector<char>& runtime_object, int num_threads,
                                         bool cuda) {
  std::unique_ptr<Jit> jit = link_runtime(runtime_object, cuda);
  auto set_num_threads = reinterpret_cast<int (*)(int)>(jit->lookup("halide_set_num_threads"));
  auto set_error_handler =
      reinterpret_cast<ErrorHandler (*)(ErrorHandler)>(jit->lookup("halide_set_error_handler"));
  auto shutdown = reinterpret_cast<void (*)()>(jit->lookup("halide_shutdown_thread_pool"));
  // Before the first kernel call: the pool's size is fixed when it starts and never shrinks.
  set_num_threads(num_threads);
  set_error_handler(&capture_halide_error);
  std::shared_ptr<Session> session(new Session(std::move(jit), num_threads));
  session->shutdown_thread_pool_ = shutdown;
  // Every parallel loop goes through jit::do_par_for, which keeps to this pool unless an OpenMP
  // runtime is set (include/optfuse/parallel.h).
  session->default_do_par_for_ = reinterpret_cast<DoParFor (*)(DoParFor)>(
      session->jit_->lookup("halide_set_custom_do_par_for"))(&do_par_for);
  if (cuda) {
    install(*session->jit_, "halide_set_cuda_acquire_context", &acquire_cuda_context);
    install(*session->jit_, "halide_set_cuda_release_context", &release_cuda_context);
    install(*session->jit_, "halide_set_cuda_get_stream", &cuda_stream);
    // A plain accessor: it touches no driver state (contexts are acquired at calls, above).
    auto interface = reinterpret_cast<const halide_device_interface_t* (*)()>(
        session->jit_->lookup("halide_cuda_device_interface"));
    session->cuda_interface_ = interface();
    // Reductions keep small per-call device buffers (block partials, totals, row values):
    // without reuse Halide would cuMemAlloc and cuMemFree them at every call, and cuMemFree
    // waits for the whole device. With reuse they are cached, per context and stream (a flag of
    // the runtime; touches no driver state).
    reinterpret_cast<int (*)(void*, bool)>(
        session->jit_->lookup("halide_reuse_device_allocations"))(nullptr, true);
  }
  return session;
}

Session::~Session() {
  if (shutdown_thread_pool_) shutdown_thread_pool_();
}

ArgvFn Session::load_kernel(const std::vector<char>& object, const std::string& fn_name) {
  std::lock_guard<std::mutex> lock(mutex_);
  return reinterpret_cast<ArgvFn>(jit_->link(object, fn_name + ".o", fn_name + "_argv"));
}

void* Session::lookup(const std::string& symbol) {
  std::lock_guard<std::mutex> lock(mutex_);
  return jit_->lookup(symbol);
}

void Session::call(ArgvFn fn, void** args, const std::string& kernel,
                   const CudaPlacement& cuda) const {
  CallContext context;
  context.cuda = cuda;
  context.session = this;
  void* user_context = &context;
  args[0] = &user_context;  // argv passes every scalar, the user context too, by address
  int rc = fn(args);
  if (rc == 0) return;
  if (context.error.empty()) context.error = "Halide error code " + std::to_string(rc);
  throw Error("kernel \"" + kernel + "\" failed: " + context.error);
}

}  // namespace optfuse::jit
