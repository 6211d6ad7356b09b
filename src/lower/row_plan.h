#pragma once
// What a per-row graph's pipeline computes once per row rather than once per element, decided
// from the graph alone before any Halide Func is built (internal; no Halide). lower.cpp builds
// the Funcs it names (src/lower/README.md, "Reductions and results").
#include <vector>

#include "optfuse/graph.h"

namespace optfuse::lower {

bool is_row_state(const Node& n);  // a Role::RowState input

bool is_col_state(const Node& n);  // a Role::ColState input

// The outputs replacing per-element inputs, those replacing row state, and those replacing
// column state, each in the kernel's order (signature.h, kernel_outputs).
std::vector<Output> element_outputs(const Graph& g);
std::vector<Output> row_state_outputs(const Graph& g);
std::vector<Output> col_state_outputs(const Graph& g);

// The nodes the element-wise stage computes per element: everything the outputs reach, except
// what only feeds reductions (their operands are computed by the prologue stages).
std::vector<bool> main_nodes(const Graph& g);

struct RowPlan {
  // By node: the same for a whole row (row state, row reductions and what is computed from
  // them), and of those, computed from a row reduction (so only after the row's reductions).
  std::vector<bool> row_level, after_reduction;
  // The maximal row-level values per-element code uses: computed before the row's reductions
  // ([0], which their operands may read too) and after them ([1]).
  std::vector<NodeId> row_values[2];
  // Graphs with row state on CPU targets: the values a row reduction reduces (z of
  // row_max(abs(z))) that the update uses too, and their square roots, computed once per row
  // (`fresh`); and then the inputs the update still loads itself (by node), those it reaches
  // without going through a fresh or row-level value.
  std::vector<NodeId> fresh;
  std::vector<bool> update_reads;
};

// The plan of a per-row graph; `gpu`: a CUDA target (no `fresh` there).
RowPlan plan_rows(const Graph& g, bool gpu);

}  // namespace optfuse::lower
