#pragma once
// Element types a graph value can have.
#include <cstddef>
#include <string>
#include <string_view>

namespace optfuse {

enum class DType { F32, F64, F16, BF16, Bool };

std::string_view dtype_name(DType t);              // "f32", "f64", "f16", "bf16", "bool"
bool parse_dtype(std::string_view s, DType* out);  // inverse of dtype_name
std::size_t dtype_size(DType t);                   // bytes per element (bool: 1)
inline bool is_float(DType t) { return t != DType::Bool; }

}  // namespace optfuse
