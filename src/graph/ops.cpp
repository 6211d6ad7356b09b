// Op, role and dtype tables. The op table is generated from ops.def so that adding an op there is
// the only edit needed for names, arity and flags.
#include <array>
#include <string>

#include "optfuse/error.h"
#include "optfuse/graph.h"

namespace optfuse {
namespace {

struct OpInfo {
  std::string_view name;
  int arity;
  unsigned flags;
};

constexpr OpInfo kOps[] = {
#define OPTFUSE_OP(e, text, arity, flags) {text, arity, static_cast<unsigned>(flags)},
#include "optfuse/ops.def"
#undef OPTFUSE_OP
};

const OpInfo& info(Op op) {
  auto i = static_cast<size_t>(op);
  if (i >= std::size(kOps)) internal_error("op code " + std::to_string(i) + " is out of range");
  return kOps[i];
}

struct DTypeInfo {
  DType type;
  std::string_view name;
  std::size_t size;
};

constexpr DTypeInfo kDTypes[] = {
    {DType::F32, "f32", 4},   {DType::F64, "f64", 8},   {DType::F16, "f16", 2},
    {DType::BF16, "bf16", 2}, {DType::Bool, "bool", 1}, {DType::U8, "u8", 1},
};

const DTypeInfo& info(DType t) {
  for (const DTypeInfo& d : kDTypes)
    if (d.type == t) return d;
  internal_error("dtype code " + std::to_string(static_cast<int>(t)) + " is out of range");
}

}  // namespace

void internal_error(const std::string& what) { throw Error("internal error: " + what); }

std::string_view op_name(Op op) { return info(op).name; }
int op_arity(Op op) { return info(op).arity; }
unsigned op_flags(Op op) { return info(op).flags; }

bool parse_op(std::string_view s, Op* out) {
  for (size_t i = 0; i < std::size(kOps); ++i) {
    if (kOps[i].name == s) {
      *out = static_cast<Op>(i);
      return true;
    }
  }
  return false;
}

std::string_view role_name(Role r) {
  switch (r) {
    case Role::Param:
      return "param";
    case Role::Grad:
      return "grad";
    case Role::State:
      return "state";
    case Role::RowState:
      return "row_state";
    case Role::ColState:
      return "col_state";
  }
  internal_error("role code " + std::to_string(static_cast<int>(r)) + " is out of range");
}

std::string_view dtype_name(DType t) { return info(t).name; }
std::size_t dtype_size(DType t) { return info(t).size; }

bool parse_dtype(std::string_view s, DType* out) {
  for (const DTypeInfo& d : kDTypes) {
    if (d.name == s) {
      *out = d.type;
      return true;
    }
  }
  return false;
}

}  // namespace optfuse
