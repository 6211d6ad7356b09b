#include "engine/composite.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>

#include "engine/kernel_impl.h"
#include "optfuse/error.h"

namespace optfuse::engine_detail {
namespace {

std::string ref(NodeId id) { return "%" + std::to_string(id); }

// Names of the caller's values that partition.h's "%N" names of crossing values could shadow.
void check_names(const KernelSignature& sig, const std::string& graph) {
  auto check = [&](const std::string& name, const char* what) {
    if (!name.empty() && name[0] == '%')
      throw Error("graph \"" + graph + "\" runs as several kernels, and its " + what + " \"" +
                  name + "\" could be mistaken for a value crossing a cut (named \"%N\", " +
                  "include/optfuse/partition.h): rename it");
  };
  for (const auto& in : sig.inputs) check(in.name, "input");
  for (const auto& s : sig.scalars) check(s.name, "scalar");
  for (const auto& r : sig.results) check(r.name, "result");
}

}  // namespace

CompositeKernel::CompositeKernel(const Partition& p, KernelSignature signature, std::string key,
                                 std::string name, Schedule resolved,
                                 std::vector<CompositeStep> steps)
    : signature_(std::move(signature)),
      key_(std::move(key)),
      name_(std::move(name)),
      schedule_(resolved),
      steps_(std::move(steps)) {
  if (steps_.size() != p.clusters.size())
    internal_error("CompositeKernel: " + std::to_string(steps_.size()) + " steps for " +
                   std::to_string(p.clusters.size()) + " clusters");
  check_names(signature_, name_);
  plan(p);
}

int CompositeKernel::temp(const std::string& name, DType dtype) {
  for (size_t i = 0; i < temps_.size(); ++i)
    if (temps_[i].name == name) return static_cast<int>(i);
  temps_.push_back({name, dtype});
  return static_cast<int>(temps_.size() - 1);
}

int CompositeKernel::carried(const std::string& name, bool create) {
  auto it = std::find(carried_.begin(), carried_.end(), name);
  if (it != carried_.end()) return static_cast<int>(it - carried_.begin());
  if (!create)
    internal_error("graph \"" + name_ + "\": " + name + " is read before a cluster computes it");
  carried_.push_back(name);
  return static_cast<int>(carried_.size() - 1);
}

void CompositeKernel::plan(const Partition& p) {
  for (size_t i = 0; i < p.clusters.size(); ++i) {
    const Cluster& c = p.clusters[i];
    const bool opaque = c.kind == Cluster::Kind::Opaque;
    if (opaque != !steps_[i].kernel || (opaque && !steps_[i].opaque))
      internal_error("CompositeKernel: step " + std::to_string(i) + " does not match its cluster");
    plans_.push_back(opaque ? plan_opaque(p, c.nodes.at(0))
                            : plan_kernel(steps_[i].kernel->signature()));
  }
  plan_snapshots();
}

// The operand of an opaque op is a leaf of the caller's, an earlier opaque op's result or a value
// an earlier kernel wrote ("%N"); its result is "%id", which later kernels read.
CompositeKernel::Plan CompositeKernel::plan_opaque(const Partition& p, NodeId id) {
  const Node& n = p.canonical.node(id);
  const NodeId operand = n.args.at(0);
  const Node& a = p.canonical.node(operand);
  Plan plan;
  if (a.op == Op::Input) {
    plan.inputs.push_back({Source::Input, signature_.input_index(a.name)});
  } else if (a.op == Op::Scalar) {
    plan.inputs.push_back({Source::Scalar, signature_.scalar_index(a.name)});
  } else if (a.op == Op::Const) {
    throw Error("graph \"" + name_ + "\": opaque op \"" + n.name +
                "\" of a constant: nothing to call it on at run time; apply it to a scalar");
  } else if (a.is_tensor) {
    auto it = std::find_if(temps_.begin(), temps_.end(),
                           [&](const Temp& t) { return t.name == ref(operand); });
    if (it == temps_.end())
      internal_error("graph \"" + name_ + "\": no kernel writes " + ref(operand) +
                     ", the operand of opaque \"" + n.name + "\"");
    plan.inputs.push_back({Source::Temp, static_cast<int>(it - temps_.begin())});
  } else {
    plan.inputs.push_back({Source::Carried, carried(ref(operand), false)});
  }
  if (n.is_tensor)
    plan.outputs.push_back({Source::Temp, temp(ref(id), n.dtype)});
  else
    plan.outputs.push_back({Source::Carried, carried(ref(id), true)});
  plan.dtype = n.dtype;
  return plan;
}

// A kernel cluster's arguments by name: the caller's where the names are the caller's, else the
// "%N" values of earlier clusters (temporaries and carried values) or for later ones.
CompositeKernel::Plan CompositeKernel::plan_kernel(const KernelSignature& ks) {
  Plan plan;
  for (const auto& in : ks.inputs) {
    const int j = signature_.input_index(in.name);
    plan.inputs.push_back(j >= 0 ? Source{Source::Input, j}
                                 : Source{Source::Temp, temp(in.name, in.dtype)});
  }
  for (const auto& s : ks.scalars) {
    const int j = signature_.scalar_index(s.name);
    plan.scalars.push_back(j >= 0 ? Source{Source::Scalar, j}
                                  : Source{Source::Carried, carried(s.name, false)});
  }
  for (const auto& out : ks.outputs) {
    int o = -1;
    for (size_t i = 0; i < signature_.outputs.size(); ++i)
      if (signature_.outputs[i].replaces == out.replaces) o = static_cast<int>(i);
    plan.outputs.push_back(o >= 0 ? Source{Source::Output, o}
                                  : Source{Source::Temp, temp(out.replaces, out.dtype)});
  }
  for (const auto& r : ks.results) {
    const int j = signature_.result_index(r.name);
    plan.results.push_back(j >= 0 ? Source{Source::Result, j}
                                  : Source{Source::Carried, carried(r.name, true)});
  }
  return plan;
}

// In place, a kernel overwrites the caller's input as it writes the output replacing it; a later
// cluster that still reads the input (an element-wise value recomputed there) must see the old
// values.
void CompositeKernel::plan_snapshots() {
  for (size_t s = 0; s < plans_.size(); ++s) {
    if (!steps_[s].kernel) continue;
    for (const Source& out : plans_[s].outputs) {
      if (out.kind != Source::Output) continue;
      const int j = signature_.input_index(signature_.outputs[out.index].replaces);
      bool later = false;
      for (size_t t = s + 1; t < plans_.size(); ++t)
        for (const Source& in : plans_[t].inputs)
          later = later || (in.kind == Source::Input && in.index == j);
      if (later) plans_[s].snapshot.push_back({j, out.index});
    }
  }
}

void CompositeKernel::check(const KernelCall& call) const {
  check_call_arguments(signature_, name_, call);
  if (call.device)
    throw Error("kernel \"" + name_ + "\" runs as " + std::to_string(steps_.size()) +
                " clusters (include/optfuse/partition.h): passing values between them on a " +
                "CUDA device is not implemented yet; its call needs host pointers");
}

void CompositeKernel::run(const KernelCall& call) const {
  check(call);
  const size_t n = static_cast<size_t>(call.n);
  std::vector<void*> in = call.inputs;  // an input's snapshot replaces it once taken
  std::vector<std::unique_ptr<unsigned char[]>> temps, snapshots;
  // Not value-initialized: zeroing would be one more pass over memory.
  auto buffer = [](size_t bytes) {
    return std::unique_ptr<unsigned char[]>(new unsigned char[bytes]);
  };
  for (const Temp& t : temps_)
    temps.push_back(buffer(std::max<size_t>(1, n * dtype_size(t.dtype))));
  std::vector<double> carried(carried_.size(), std::nan(""));
  auto tensor = [&](const Source& s) -> void* {
    switch (s.kind) {
      case Source::Input:
        return in[s.index];
      case Source::Output:
        return call.outputs[s.index];
      case Source::Temp:
        return temps[s.index].get();
      default:
        internal_error("CompositeKernel: a uniform value where a tensor belongs");
    }
  };
  auto uniform = [&](const Source& s) -> double& {
    if (s.kind == Source::Carried) return carried[s.index];
    if (s.kind == Source::Result) return call.results[s.index];
    if (s.kind != Source::Scalar) internal_error("CompositeKernel: a tensor where a value belongs");
    return const_cast<double&>(call.scalars[s.index]);  // only read: no plan writes a scalar
  };
  for (size_t i = 0; i < steps_.size(); ++i) {
    const Plan& plan = plans_[i];
    for (auto [j, o] : plan.snapshot) {
      if (n == 0 || call.outputs[o] != in[j]) continue;
      const size_t bytes = n * dtype_size(signature_.inputs[j].dtype);
      snapshots.push_back(buffer(bytes));
      std::memcpy(snapshots.back().get(), in[j], bytes);
      in[j] = snapshots.back().get();
    }
    const CompositeStep& step = steps_[i];
    if (!step.kernel) {
      const Source& operand = plan.inputs[0];
      const Source& result = plan.outputs[0];
      if (result.kind == Source::Temp) {
        if (n > 0)
          step.opaque(
              {step.callee, tensor(operand), tensor(result), plan.dtype, call.n, call.cols});
      } else {
        const double x = uniform(operand);
        double y = std::nan("");
        step.opaque({step.callee, &x, &y, DType::F64, 1, call.cols});
        uniform(result) = y;
      }
      continue;
    }
    KernelCall sub;
    sub.n = call.n;
    sub.cols = call.cols;
    sub.serial = call.serial;
    for (const Source& s : plan.inputs) sub.inputs.push_back(tensor(s));
    for (const Source& s : plan.scalars) sub.scalars.push_back(uniform(s));
    for (const Source& s : plan.outputs) sub.outputs.push_back(tensor(s));
    std::vector<double> results(plan.results.size());
    sub.results = results.data();
    step.kernel->run(sub);
    for (size_t r = 0; r < plan.results.size(); ++r) uniform(plan.results[r]) = results[r];
  }
}

}  // namespace optfuse::engine_detail
