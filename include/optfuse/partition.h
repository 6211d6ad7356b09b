#pragma once
// Partitioning: a graph -> fusion clusters, one kernel each, every decision with its reason.
// Engine::kernel compiles exactly these clusters (engine.h): one cluster is one kernel, several
// run in order behind one Kernel, which passes the "%N" values below from cluster to cluster.
//
//   Partition p = partition(graph);
//   for (const Cluster& c : p.clusters) ...   // in execution order
//   std::cout << explain(p);                  // canonical graph, clusters, decisions
//
// The policy (memory traffic is the cost model):
//   * element-wise ops fuse into one region, as large as possible: a region is one pass over
//     memory however many ops it has;
//   * a whole-tensor reduction is a prologue stage of the kernel whose element-wise stage uses
//     it (every tensor of a graph has the same element count, so the operand and the consumer
//     always agree on the tensor size); per-row reductions likewise, computed per row;
//     per-column reductions likewise, each a stage over the whole tensor. A region with
//     per-column reductions or column state is staged (src/lower/README.md): every reduction
//     in it is a stage of the one kernel, computed in dependency order, so a whole-tensor
//     reduction may use row and column reductions there (Adafactor's update RMS);
//   * cut points: opaque ops (an external call is never inside a kernel: it runs between two),
//     and whole-tensor reductions in a region that has per-row reductions but is not staged
//     (its per-row kernel computes rows inside the update's row loop: the reduction runs first
//     in a statistics kernel and reaches the update as a scalar);
//   * a value needed on both sides of a cut is recomputed when it is element-wise (cheaper than
//     a pass over memory) and passed across when it is the result of a reduction (a scalar) or
//     of an opaque op (a tensor the caller materializes).
#include <string>
#include <vector>

#include "optfuse/graph.h"

namespace optfuse {

// One decision about an edge producer -> consumer of the canonical graph (node ids).
struct FusionDecision {
  enum class Verdict { Fuse, Cut, Recompute };
  enum class Why {
    ElementwiseChain,   // element-wise into element-wise: same loop
    ReductionPrologue,  // whole-tensor reduction into its consumer: root stage of one pipeline
    RowPrologue,        // per-row reduction into its consumer: per-row stage of one pipeline
    ColumnPrologue,     // per-column reduction into its consumer: a stage of one pipeline
    OpaqueProducer,     // an opaque op's result: computed outside, an input of the next kernel
    OpaqueConsumer,     // an opaque op's operand: written by the kernel before it
    ReductionCut,       // whole-tensor reduction into another kernel (one with per-row
                        // reductions, or one after an opaque op): passed as a scalar
    Duplicated,         // an element-wise value computed again in a later kernel
  };
  Verdict verdict;
  Why why;
  NodeId producer, consumer;
  std::string reason;  // one line, for people: says what and why
};

std::string_view verdict_name(FusionDecision::Verdict v);  // "fuse", "cut", "recompute"

// A cluster: one kernel (its own self-contained graph), or one opaque op run by the caller.
struct Cluster {
  enum class Kind { Kernel, Opaque };
  Kind kind = Kind::Kernel;
  std::vector<NodeId> nodes;  // canonical-graph nodes it computes (non-leaf), ascending
  // Kernel: the graph to compile. Values crossing a cut appear as inputs named "%N" (a tensor
  // from an opaque op: state "%N"), scalars named "%N" (a reduction computed by an earlier
  // kernel), an output "%N" over a state "%N" (a tensor an opaque op needs), or a result "%N".
  Graph graph;
  std::string summary;  // e.g. "element-wise + 1 whole-tensor reduction (prologue)"
};

struct Partition {
  Graph canonical;                        // canonicalize(g): the numbering used below
  std::vector<Cluster> clusters;          // in an order that respects every dependency
  std::vector<FusionDecision> decisions;  // one per edge between non-leaf nodes
  int kernels() const;                    // clusters of kind Kernel
};

Partition partition(const Graph& g);

// Human-readable: the canonical graph, each cluster (nodes, summary, its graph), each decision.
std::string explain(const Partition& p);

}  // namespace optfuse
