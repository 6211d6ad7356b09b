// The partitioner (policy in include/optfuse/partition.h). Three steps over the canonical graph:
//   1. place every non-leaf node in a region: (epoch, phase). The epoch counts the opaque ops on
//      the way from the leaves (an opaque op's consumers run after it, in a later kernel); the
//      phase counts "cut" reductions, which a region cannot compute for its own use;
//   2. gather the roots each region must produce (outputs, results, values crossing a cut) and
//      copy each region's graph from its roots down to the leaves or to a cut boundary;
//   3. record a decision, with its reason, for every edge.
#include "optfuse/partition.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "optfuse/error.h"

namespace optfuse {
namespace {

using Why = FusionDecision::Why;
using Verdict = FusionDecision::Verdict;

struct Region {
  int epoch = 0, phase = 0;
  bool operator<(const Region& o) const {
    return std::tie(epoch, phase) < std::tie(o.epoch, o.phase);
  }
  bool operator==(const Region& o) const { return epoch == o.epoch && phase == o.phase; }
  bool operator!=(const Region& o) const { return !(*this == o); }
};

std::string ref(NodeId id) { return "%" + std::to_string(id); }
std::string op_of(const Node& n) { return std::string(op_name(n.op)); }

class Partitioner {
 public:
  explicit Partitioner(const Graph& g) : c_(canonicalize(g)) {
    const size_t n = c_.nodes().size();
    region_.resize(n);
    consumers_.resize(n);
    for (size_t id = 0; id < n; ++id)
      for (NodeId a : c_.nodes()[id].args) consumers_[a].push_back(static_cast<NodeId>(id));
    place();
  }

  Partition run() {
    Partition p;
    p.canonical = c_;
    collect_roots();
    for (auto& [region, roots] : roots_) {
      Cluster cl = kernel_cluster(region, roots);
      clusters_.push_back({std::make_tuple(region.epoch, region.phase, NodeId(-1)), std::move(cl)});
    }
    for (size_t id = 0; id < c_.nodes().size(); ++id) {
      const Node& n = c_.nodes()[id];
      if (n.op != Op::Opaque) continue;
      Cluster cl;
      cl.kind = Cluster::Kind::Opaque;
      cl.nodes = {static_cast<NodeId>(id)};
      cl.summary = "opaque \"" + n.name + "\" (" + ref(n.args[0]) + " -> " +
                   ref(static_cast<NodeId>(id)) + "), run by the caller between kernels";
      clusters_.push_back(
          {std::make_tuple(region_[id].epoch, 1 << 30, static_cast<NodeId>(id)), std::move(cl)});
    }
    std::stable_sort(clusters_.begin(), clusters_.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    for (auto& entry : clusters_) p.clusters.push_back(std::move(entry.second));
    p.decisions = decisions();
    return p;
  }

 private:
  const Node& node(NodeId id) const { return c_.node(id); }
  bool is_opaque(NodeId id) const { return node(id).op == Op::Opaque; }
  bool is_whole(NodeId id) const { return op_has(node(id).op, kReduce); }
  bool is_row(NodeId id) const { return op_has(node(id).op, kRowReduce); }
  bool is_col(NodeId id) const { return op_has(node(id).op, kColReduce); }
  bool reads_col_state(NodeId id) const {
    for (NodeId a : node(id).args)
      if (node(a).op == Op::Input && node(a).role == Role::ColState) return true;
    return false;
  }
  bool is_leaf(NodeId id) const { return op_has(node(id).op, kLeaf); }

  // Step 1. Nodes are numbered operands first (canonical form), so one forward sweep suffices.
  void place() {
    const size_t n = c_.nodes().size();
    for (size_t id = 0; id < n; ++id) {
      int e = 0;
      for (NodeId a : node(id).args) e = std::max(e, region_[a].epoch + (is_opaque(a) ? 1 : 0));
      region_[id].epoch = e;
    }
    // Epochs with per-column reductions or column state lower as staged kernels (every
    // reduction a stage of one kernel); of the others, those with per-row reductions compute
    // them in the update's row loop.
    std::set<int> row_epochs, staged_epochs;
    for (size_t id = 0; id < n; ++id) {
      const NodeId i = static_cast<NodeId>(id);
      if (is_row(i)) row_epochs.insert(region_[id].epoch);
      if (is_col(i) || reads_col_state(i)) staged_epochs.insert(region_[id].epoch);
    }
    for (int e : staged_epochs) row_epochs.erase(e);
    staged_epochs_ = staged_epochs;
    // A whole-tensor reduction is cut from its consumers when they are in a per-row region that
    // is not staged, or in a later epoch (after an opaque op): its value then crosses as a
    // scalar.
    cut_.assign(n, false);
    for (size_t id = 0; id < n; ++id) {
      if (!is_whole(static_cast<NodeId>(id))) continue;
      bool later = false;
      for (NodeId u : consumers_[id]) later = later || region_[u].epoch != region_[id].epoch;
      cut_[id] = row_epochs.count(region_[id].epoch) > 0 || later;
    }
    for (size_t id = 0; id < n; ++id) {
      int ph = 0;
      for (NodeId a : node(id).args)
        if (region_[a].epoch == region_[id].epoch && !is_opaque(a))
          ph = std::max(ph, region_[a].phase + (cut_[a] ? 1 : 0));
      region_[id].phase = ph;
    }
  }

  // Where a root value is produced: its own region, except leaves (the first kernel) and opaque
  // results (the kernel after the opaque op).
  Region home(NodeId id) const {
    if (is_leaf(id)) return {0, 0};
    if (is_opaque(id)) return {region_[id].epoch + 1, 0};
    return region_[id];
  }

  struct Root {
    enum Kind { Output, Result, Crossing } kind;
    std::string name;
    NodeId value;
  };

  // Step 2a. A value crossing to several consumers is one root.
  void add_root(Region r, Root root) {
    for (const Root& have : roots_[r])
      if (have.kind == root.kind && have.name == root.name) return;
    roots_[r].push_back(std::move(root));
  }

  void collect_roots() {
    for (const Output& o : c_.outputs())
      roots_[home(o.value)].push_back({Root::Output, o.replaces, o.value});
    for (const Result& r : c_.results())
      roots_[home(r.value)].push_back({Root::Result, r.name, r.value});
    for (size_t id = 0; id < c_.nodes().size(); ++id) {
      const NodeId i = static_cast<NodeId>(id);
      if (cut_[id]) add_root(home(i), {Root::Crossing, ref(i), i});
      const NodeId operand = node(i).args.empty() ? -1 : node(i).args[0];
      if (is_opaque(i) && !is_leaf(operand) && !is_opaque(operand))
        add_root(home(operand), {Root::Crossing, ref(operand), operand});
    }
  }

  // Step 2b: copies `id` into `out` for `region`, stopping at boundaries.
  NodeId copy(NodeId id, Region region, Graph& out, std::map<NodeId, NodeId>& done,
              std::set<NodeId>& computed) {
    if (auto it = done.find(id); it != done.end()) return it->second;
    const Node& n = node(id);
    NodeId result;
    bool boundary = is_opaque(id) || (cut_[id] && home(id) != region);
    if (boundary && n.is_tensor) {
      result = out.state(ref(id), n.dtype).id();
    } else if (boundary) {
      result = out.scalar(ref(id), n.dtype).id();
    } else if (n.op == Op::Input) {
      // Declared already when an earlier root's output replaces it (kernel_cluster).
      const NodeId declared = out.find_input(n.name);
      result = declared >= 0 ? declared : out.input(n.role, n.name, n.dtype).id();
    } else if (n.op == Op::Scalar) {
      result = out.scalar(n.name, n.dtype).id();
    } else {
      Node copy_of = n;
      for (NodeId& a : copy_of.args) a = copy(a, region, out, done, computed);
      result = out.add_node(std::move(copy_of));
      if (n.op != Op::Const) computed.insert(id);
    }
    done[id] = result;
    return result;
  }

  Cluster kernel_cluster(Region region, const std::vector<Root>& roots) {
    Cluster cl;
    cl.graph = Graph(c_.name() + ".k" + std::to_string(kernel_count_++));
    std::map<NodeId, NodeId> done;
    std::set<NodeId> computed;
    for (const Root& r : roots) {
      NodeId v = copy(r.value, region, cl.graph, done, computed);
      Value value = cl.graph.value(v);
      if (r.kind == Root::Output) {
        const Node& replaced = node(c_.find_input(r.name));
        if (cl.graph.find_input(r.name) < 0) cl.graph.input(replaced.role, r.name, replaced.dtype);
        cl.graph.output(r.name, value);
      } else if (r.kind == Root::Result || !node(r.value).is_tensor) {
        cl.graph.result(r.name, value);
      } else {  // a tensor an opaque op reads: written out over a state buffer of its own
        if (cl.graph.find_input(r.name) < 0) cl.graph.state(r.name, node(r.value).dtype);
        cl.graph.output(r.name, value);
      }
    }
    cl.nodes.assign(computed.begin(), computed.end());
    for (NodeId id : computed) computed_in_[id].insert(region);
    cl.summary = summary(cl.nodes, roots);
    return cl;
  }

  std::string summary(const std::vector<NodeId>& nodes, const std::vector<Root>& roots) const {
    int elementwise = 0, whole = 0, rows = 0, cols = 0, outputs = 0, results = 0, crossing = 0;
    for (NodeId id : nodes)
      (is_whole(id) ? whole : is_row(id) ? rows : is_col(id) ? cols : elementwise) += 1;
    for (const Root& r : roots)
      (r.kind == Root::Output ? outputs : r.kind == Root::Result ? results : crossing) += 1;
    std::string s = std::to_string(elementwise) + " element-wise op(s)";
    if (whole) s += ", " + std::to_string(whole) + " whole-tensor reduction(s) as prologue";
    if (rows)
      s += ", " + std::to_string(rows) + " per-row reduction(s) computed " +
           (cols ? "as stages" : "per row");
    if (cols) s += ", " + std::to_string(cols) + " per-column reduction(s) as stages";
    s += "; writes " + std::to_string(outputs) + " output(s), " + std::to_string(results) +
         " result(s)";
    if (crossing) s += ", " + std::to_string(crossing) + " value(s) for later clusters";
    return s;
  }

  // Step 3.
  std::vector<FusionDecision> decisions() const {
    std::vector<FusionDecision> out;
    for (size_t id = 0; id < c_.nodes().size(); ++id) {
      const NodeId n = static_cast<NodeId>(id);
      if (is_leaf(n)) continue;
      std::set<NodeId> seen;
      for (NodeId a : node(n).args) {
        if (is_leaf(a) || !seen.insert(a).second) continue;
        out.push_back(decide(a, n));
      }
    }
    return out;
  }

  // The regions whose kernels compute `id` (its own region if none needs it there).
  std::set<Region> regions_of(NodeId id) const {
    auto it = computed_in_.find(id);
    if (it == computed_in_.end() || it->second.empty()) return {region_[id]};
    return it->second;
  }

  FusionDecision decide(NodeId a, NodeId n) const {
    const std::string edge = ref(a) + " " + op_of(node(a)) + " -> " + ref(n) + " " + op_of(node(n));
    auto d = [&](Verdict v, Why w, const std::string& why) {
      return FusionDecision{v, w, a, n, edge + ": " + why};
    };
    if (is_opaque(a))
      return d(Verdict::Cut, Why::OpaqueProducer,
               "opaque \"" + node(a).name +
                   "\" is never fused; its result is an input of the next kernel");
    if (is_opaque(n))
      return d(Verdict::Cut, Why::OpaqueConsumer,
               "operand of opaque \"" + node(n).name + "\"; " +
                   (node(a).is_tensor ? "written to memory" : "returned as a result") +
                   " by the kernel before it");
    const std::set<Region> where_a = regions_of(a), where_n = regions_of(n);
    bool shared = false;
    for (const Region& r : where_n) shared = shared || where_a.count(r) > 0;
    if (!shared) {
      if (!cut_[a]) internal_error("partition: " + edge + " crosses kernels without a cut");
      bool mixed = region_[a].epoch == region_[n].epoch;
      return d(
          Verdict::Cut, Why::ReductionCut,
          mixed ? "a whole-tensor reduction cannot share a kernel with per-row reductions "
                  "(yet): a statistics kernel computes it first, this kernel reads it as a scalar"
                : "the reduction is computed before the opaque op; the later kernel reads it "
                  "as a scalar");
    }
    if (where_a.size() > 1)
      return d(Verdict::Recompute, Why::Duplicated,
               "computed in more than one kernel (element-wise: recomputing is cheaper than a pass "
               "over memory)");
    if (is_whole(a))
      return d(Verdict::Fuse, Why::ReductionPrologue,
               "whole-tensor reduction over the same elements: a root stage computed before the "
               "element-wise loop of the same pipeline");
    if (is_row(a))
      return d(Verdict::Fuse, Why::RowPrologue,
               staged_epochs_.count(region_[a].epoch)
                   ? "per-row reduction: a stage computed before its users (in the loop over "
                     "rows of a column reduction of the same value, if any), inside the same "
                     "pipeline"
                   : "per-row reduction: computed at the start of each row, inside the same "
                     "pipeline");
    if (is_col(a))
      return d(Verdict::Fuse, Why::ColumnPrologue,
               "per-column reduction: a stage over the whole tensor computed before its users, "
               "inside the same pipeline");
    if (is_whole(n) || is_row(n) || is_col(n))
      return d(Verdict::Fuse, Why::ElementwiseChain,
               "element-wise operand of the reduction: computed inside the reduction's loop, no "
               "memory traffic");
    return d(Verdict::Fuse, Why::ElementwiseChain, "element-wise: same loop, no memory traffic");
  }

  Graph c_;
  std::vector<Region> region_;
  std::vector<std::vector<NodeId>> consumers_;
  std::vector<bool> cut_;
  std::set<int> staged_epochs_;  // epochs with column reductions or column state
  std::map<Region, std::vector<Root>> roots_;
  std::map<NodeId, std::set<Region>> computed_in_;  // node -> regions whose kernel computes it
  std::vector<std::pair<std::tuple<int, int, NodeId>, Cluster>> clusters_;
  int kernel_count_ = 0;
};

}  // namespace

std::string_view verdict_name(FusionDecision::Verdict v) {
  switch (v) {
    case Verdict::Fuse:
      return "fuse";
    case Verdict::Cut:
      return "cut";
    case Verdict::Recompute:
      return "recompute";
  }
  internal_error("verdict_name: bad verdict");
}

int Partition::kernels() const {
  return static_cast<int>(std::count_if(clusters.begin(), clusters.end(), [](const Cluster& c) {
    return c.kind == Cluster::Kind::Kernel;
  }));
}

Partition partition(const Graph& g) { return Partitioner(g).run(); }

std::string explain(const Partition& p) {
  std::string s = "canonical graph:\n" + print(p.canonical);
  s += "\nclusters (" + std::to_string(p.clusters.size()) + ", " + std::to_string(p.kernels()) +
       " kernel(s)), in execution order:\n";
  for (size_t i = 0; i < p.clusters.size(); ++i) {
    const Cluster& c = p.clusters[i];
    s += "  [" + std::to_string(i) + "] " +
         (c.kind == Cluster::Kind::Kernel ? "kernel" : "opaque") + ": " + c.summary +
         "\n      nodes:";
    for (NodeId id : c.nodes) s += " " + ref(id);
    s += "\n";
    if (c.kind == Cluster::Kind::Kernel) {
      std::string text = print(c.graph);
      for (size_t at = 0, next; at < text.size(); at = next + 1) {
        next = text.find('\n', at);
        if (next == std::string::npos) next = text.size();
        s += "      | " + text.substr(at, next - at) + "\n";
      }
    }
  }
  s += "\ndecisions:\n";
  for (const FusionDecision& d : p.decisions)
    s += "  " + std::string(verdict_name(d.verdict)) + "  " + d.reason + "\n";
  return s;
}

}  // namespace optfuse
