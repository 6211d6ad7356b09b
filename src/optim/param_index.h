#pragma once
// Every param's memory, sorted by address, so that a new gradient is checked against all params
// in O(log n). A training loop that rebinds every gradient at every step (torch's
// zero_grad(set_to_none=True) gives new ones) must not pay O(n) per set_grad, O(n^2) per step.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "optfuse/optim.h"

namespace optfuse::optim {

// One past the last byte of `t`'s memory (tensor_checks.cpp's overlap checks use it too).
uintptr_t end_address(const TensorRef& t);

class ParamIndex {
 public:
  // Adds group `group`'s params (already checked against each other and every other tensor).
  void add_group(const std::vector<ParamRef>& params, size_t group);
  // Throws Error "<who>: grad memory overlaps the param of <name_of(group, index)>" if `t` (a
  // gradient, or a sparse gradient's values) overlaps any param. Gradients may share memory
  // with each other (they are only read), so params are all it is checked against.
  void check_disjoint(const TensorRef& t, const std::string& who,
                      const std::function<std::string(size_t, size_t)>& name_of) const;

 private:
  struct Entry {
    uintptr_t begin, end;
    size_t group, index;
  };
  std::vector<Entry> entries_;  // params never overlap, so sorted by begin is sorted by end
};

}  // namespace optfuse::optim
