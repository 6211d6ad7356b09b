#pragma once
// A graph the partitioner cuts into several clusters (include/optfuse/partition.h), run as one
// Kernel: the clusters in order, each kernel cluster by its own compiled kernel and each opaque
// one by its registered implementation (OpaqueCall, engine.h), with the values crossing a cut
// ("%N" in the clusters' graphs) passed on by the composite. Callers see the whole graph's
// signature and key. Graphs the partitioner keeps whole never get one: Engine::kernel returns
// their kernel as it is.
#include <memory>
#include <string>
#include <vector>

#include "optfuse/engine.h"
#include "optfuse/partition.h"

namespace optfuse::engine_detail {

// One cluster as it runs: a compiled kernel, or an opaque op's implementation.
struct CompositeStep {
  std::shared_ptr<const Kernel> kernel;  // kernel clusters
  std::string callee;                    // opaque clusters: Node::name of the op
  OpaqueFn opaque;                       // and its implementation
};

class CompositeKernel final : public Kernel {
 public:
  // `p`: the partition of the canonical graph whose signature is `signature`; `steps`: one per
  // cluster of `p`, in the same order. Throws Error for a graph whose own names could be
  // mistaken for the "%N" names of crossing values.
  CompositeKernel(const Partition& p, KernelSignature signature, std::string key, std::string name,
                  Schedule resolved, std::vector<CompositeStep> steps);

  const KernelSignature& signature() const override { return signature_; }
  const std::string& key() const override { return key_; }
  const std::string& name() const override { return name_; }
  const Schedule& schedule() const override { return schedule_; }
  // Host pointers only: a device call is an Error (passing values between the kernels of a CUDA
  // target is not implemented yet).
  void run(const KernelCall& call) const override;

  const std::vector<CompositeStep>& steps() const { return steps_; }

 private:
  // Where one argument of a step comes from: the composite's call (its input, output, scalar or
  // result at `index`), a temporary tensor, or a carried value (a host double).
  struct Source {
    enum Kind { Input, Output, Scalar, Result, Temp, Carried } kind;
    int index;
  };
  // A step's arguments, in its kernel's signature order (an opaque step: inputs[0] its operand,
  // outputs[0] its result). `snapshot`: (input, output) pairs of the composite's call: before
  // this step writes that output, a later step still reads that input, so it is copied first
  // when the two are the same memory.
  struct Plan {
    std::vector<Source> inputs, scalars, outputs, results;
    std::vector<std::pair<int, int>> snapshot;
    DType dtype = DType::F32;  // an opaque step's tensor operand and result
  };
  struct Temp {
    std::string name;
    DType dtype;
  };

  void plan(const Partition& p);
  Plan plan_opaque(const Partition& p, NodeId id);
  Plan plan_kernel(const KernelSignature& ks);
  void plan_snapshots();
  int temp(const std::string& name, DType dtype);
  int carried(const std::string& name, bool create);
  void check(const KernelCall& call) const;

  KernelSignature signature_;
  std::string key_, name_;
  Schedule schedule_;
  std::vector<CompositeStep> steps_;
  std::vector<Plan> plans_;
  std::vector<Temp> temps_;
  std::vector<std::string> carried_;  // names of the carried values
};

}  // namespace optfuse::engine_detail
