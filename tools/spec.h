#pragma once
// Model specs for `optfuse warmup` (format: examples/specs/README.md): the optimizer as
// torch.optim names it, param groups with overrides, and parameters with name, shape and dtype.
#include <cstdint>
#include <string>
#include <vector>

#include "optfuse/optim.h"

namespace optfuse::tools {

struct ModelSpec {
  struct Param {
    std::string name;
    std::vector<int64_t> shape;
    std::string dtype;
    int64_t numel = 1;
  };
  struct Group {
    Options overrides;            // group options other than "params" / "match"
    std::vector<size_t> params;   // indices into ModelSpec::params
  };
  std::string path;
  std::string model;  // "model" field, else the file name
  Options optimizer;  // {"type": ..., defaults...}
  std::vector<Param> params;
  std::vector<Group> groups;
};

// Reads and checks a spec; Error naming the file and the field at fault.
ModelSpec load_spec(const std::string& path);

}  // namespace optfuse::tools
