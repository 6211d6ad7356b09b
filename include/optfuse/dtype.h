#pragma once
// Element types a graph value can have.
#include <cstddef>
#include <string>
#include <string_view>

namespace optfuse {

// U8: 8-bit codes of block-quantized state (docs/int8-state.md); like bool it only enters and
// leaves arithmetic through cast (f32 -> u8 truncates toward zero, as C does).
enum class DType { F32, F64, F16, BF16, Bool, U8 };

std::string_view dtype_name(DType t);              // "f32", "f64", "f16", "bf16", "bool", "u8"
bool parse_dtype(std::string_view s, DType* out);  // inverse of dtype_name
std::size_t dtype_size(DType t);                   // bytes per element (bool: 1)
inline bool is_float(DType t) { return t != DType::Bool && t != DType::U8; }

}  // namespace optfuse
