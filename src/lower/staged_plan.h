#pragma once
// What a staged graph's pipeline computes where, decided from the graph alone before any Halide
// Func is built (internal; no Halide). A graph is staged when it has column reductions or column
// state (uses_cols): lower/staged.cpp builds its pipeline (src/lower/README.md, "Staged graphs").
#include <optional>
#include <vector>

#include "optfuse/graph.h"

namespace optfuse::lower {

// Where a per-element value varies in the [cols, rows] view cut into batches of batch_rows rows:
// along a row (x) and between the rows of a batch. Row-level values vary between rows only (row
// state, row reductions), column-level ones along a row and between batches only (column state,
// column reductions), batch-level ones between batches only (a column mean of row state).
struct Level {
  bool along_row = false, across_rows = false;
  bool element() const { return along_row && across_rows; }
};

// The Func of a stage: one value per row (y), per column of each batch (x, b), or per batch (b).
enum class Domain { Row, Column, Batch };

struct StagedPlan {
  std::vector<Level> level;  // by node; uniform nodes vary nowhere
  // By node: the domain of the root Func it is computed into, if it gets one: every row and
  // column reduction (a row reduction per row; a column reduction per column of each batch, or
  // per batch when its operand is the same along a row), and the row-, column- and batch-level
  // values that reductions, outputs or nodes of another level read.
  std::vector<std::optional<Domain>> stage;
};

StagedPlan plan_staged(const Graph& g);

// The nodes the element-wise stage (`out`) computes itself: per-element nodes an element
// output reaches other than through a stage; and of the inputs, those it loads (by node).
std::vector<bool> staged_main_nodes(const Graph& g, const StagedPlan& p);

}  // namespace optfuse::lower
