#include "optim/device_support.h"

#include "jit/halide_bridge.h"
#include "optfuse/error.h"
#include "optim/device_buffer.h"

namespace optfuse {

const char* memory_name(Memory m) { return m == Memory::Cuda ? "cuda" : "host"; }

namespace optim {

namespace {

std::string not_yet(const std::string& what) {
  return what + " is not supported on CUDA device tensors yet";
}

std::string memory_text(Memory m) {
  return m == Memory::Cuda ? "CUDA device memory" : "host memory";
}

}  // namespace

Memory engine_memory(const Engine& engine) {
  return jit::target_uses_cuda(engine.target_string()) ? Memory::Cuda : Memory::Host;
}

void check_group_memory(const std::vector<ParamRef>& params, const Memory* existing, Memory engine,
                        const std::string& target, const std::function<std::string(size_t)>& who) {
  if (params.empty()) return;
  // The optimizer's memory so far: its tensors', else this group's first param's.
  const Memory want = existing ? *existing : params[0].param.memory;
  const std::string from =
      existing ? "the optimizer's tensors are" : "the group's first param (tensor 0) is";
  for (size_t i = 0; i < params.size(); ++i)
    for (const auto* t : {&params[i].param, &params[i].grad}) {
      if (t->data == nullptr && t == &params[i].grad) continue;  // sparse-gradient rules
      if (t->memory != want)
        throw Error(who(i) + ": " + (t == &params[i].param ? "param" : "grad") + " is in " +
                    memory_text(t->memory) + " but " + from + " in " + memory_text(want) +
                    "; one optimizer does not mix host and device tensors");
    }
  if (want != engine)
    throw Error(
        who(0) + ": param is in " + memory_text(want) + " but the engine's target " + target +
        (engine == Memory::Cuda ? " runs kernels on a CUDA device: give device tensors "
                                  "(TensorRef::memory = Memory::Cuda)"
                                : " runs kernels on the CPU: give host tensors, or create the "
                                  "engine with a CUDA target (e.g. \"host-cuda\")"));
}

void check_grad_memory(const TensorRef& grad, Memory engine, const std::string& who) {
  if (grad.memory != engine)
    throw Error(who + ": the new grad is in " + memory_text(grad.memory) +
                " but this optimizer's tensors are in " + memory_text(engine));
}

void check_device_pointer(void* context, const TensorRef& t, const char* what,
                          const std::string& who) {
  if (!context || t.memory != Memory::Cuda || !t.data) return;
  std::string problem = device_pointer_problem(context, t.data);
  if (!problem.empty())
    throw Error(who + ": " + what + " pointer (Memory::Cuda) " + problem +
                "; give a CUDA device pointer, or host tensors to an engine with a CPU target");
}

void check_device_config(Memory m, const UpdateRule& rule, const StepOptions& step) {
  if (m != Memory::Cuda) return;
  const std::string where = "optimizer config: ";
  if (rule.sparse_grads()) throw Error(where + not_yet(rule.type() + " (row-sparse gradients)"));
  if (step.clipping())
    throw Error(where + not_yet("max_grad_norm (global-norm clipping needs a GPU reduction)"));
  if (step.loss_scaling())
    throw Error(where + not_yet("loss_scale (the overflow check needs a GPU reduction)"));
}

void check_device_group(Memory m, const UpdateRule& rule, const Options& options,
                        const std::string& where) {
  if (m != Memory::Cuda) return;
  if (options.value("grad_centralization", false))
    throw Error(where + ": " + not_yet("grad_centralization (it needs a GPU row reduction)"));
  if (!options.value("master_weights", true))
    throw Error(where + ": " +
                not_yet("master_weights false (16-bit state buffers are host-only so far)"));
  if (options.value("state_dtype", "f32") == "int8")
    throw Error(where + ": " + not_yet("state_dtype \"int8\" (8-bit state is host-only so far)"));
  if (rule.factored_graph(options))
    throw Error(where + ": " +
                not_yet(rule.type() + " (its factored second moment needs column reductions, "
                                      "which are not lowered for CUDA targets yet)"));
  const Graph g = rule.graph(options);
  for (const Node& n : g.nodes())
    if (op_has(n.op, kOpaque))
      throw Error(where + ": " +
                  not_yet(rule.type() + " (its update calls opaque op \"" + n.name +
                          "\" between kernels: values cross kernels on the host only)"));
  if (has_reductions(g))
    throw Error(where + ": " +
                not_yet(rule.type() + " (its update reduces over tensors, e.g. "
                                      "trust ratios from norms: it needs GPU reductions)"));
}

void check_device_params(Memory m, DType param, const std::string& where) {
  // bf16 stores compile for CUDA since the lowering writes them as integer operations
  // (src/lower/bf16.h); every param dtype the CPU takes is taken here too.
  (void)m;
  (void)param;
  (void)where;
}

void check_step_args(Memory m, const StepArgs& args) {
  if (m == Memory::Host && args.cuda_stream)
    throw Error(
        "step: a CUDA stream was given, but this optimizer's tensors are host memory "
        "(its engine's target runs on the CPU)");
}

}  // namespace optim
}  // namespace optfuse
