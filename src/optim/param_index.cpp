#include "optim/param_index.h"

#include <algorithm>

#include "optfuse/error.h"

namespace optfuse::optim {

uintptr_t end_address(const TensorRef& t) {
  return reinterpret_cast<uintptr_t>(t.data) +
         static_cast<uintptr_t>(t.numel) * dtype_size(t.dtype);
}

void ParamIndex::add_group(const std::vector<ParamRef>& params, size_t group) {
  for (size_t i = 0; i < params.size(); ++i)
    entries_.push_back({reinterpret_cast<uintptr_t>(params[i].param.data),
                        end_address(params[i].param), group, i});
  std::sort(entries_.begin(), entries_.end(),
            [](const Entry& a, const Entry& b) { return a.begin < b.begin; });
}

void ParamIndex::check_disjoint(const TensorRef& t, const std::string& who,
                                const std::function<std::string(size_t, size_t)>& name_of) const {
  const uintptr_t begin = reinterpret_cast<uintptr_t>(t.data), end = end_address(t);
  // The last param starting before `t` ends is the only one that can reach into it.
  auto after = std::lower_bound(entries_.begin(), entries_.end(), end,
                                [](const Entry& e, uintptr_t x) { return e.begin < x; });
  if (after == entries_.begin() || (after - 1)->end <= begin) return;
  const Entry& param = *(after - 1);
  throw Error(who + ": grad memory overlaps the param of " + name_of(param.group, param.index));
}

}  // namespace optfuse::optim
