#pragma once
// What add_param_group, set_grad and set_sparse_grad check about the caller's tensors before they
// change anything: pointers, element counts and shapes, memory overlaps, and the shapes gradient
// centralization needs. Each throws Error naming the group and tensor at fault.
#include <cstdint>
#include <string>
#include <vector>

#include "optim/optimizer_state.h"

namespace optfuse::optim {

// A non-null pointer, numel > 0, and a shape (when given) whose product is numel.
void check_tensor(const TensorRef& t, const char* what, const std::string& where);

// One memory range of a param or grad, for overlap checks.
struct Span {
  uintptr_t begin, end;
  bool is_param;
  std::string who;
};
Span span_of(const TensorRef& t, bool is_param, std::string who);

// Rejects any overlap that involves a param (grads may share memory with each other: read-only).
void check_overlaps(std::vector<Span> spans);

// Every param and grad of every group.
std::vector<Span> all_spans(const std::vector<OptimizerState::Group>& groups);

// With grad_centralization on, every tensor must have a shape (GC needs its rows).
void check_gc_shapes(const Options& options, const std::vector<OptimizerState::Tensor>& tensors,
                     size_t group);

}  // namespace optfuse::optim
