#pragma once
// The one check for names where they enter optfuse: graph, input, scalar, output, result and
// opaque names (the builders in src/graph/graph.cpp, so the text and JSON parsers too), JSON node
// ids, and optimizer type and option names (src/optim/). A name is UTF-8 text without NUL: the
// JSON printer cannot write invalid UTF-8 (nlohmann throws), Python cannot hold it as a str, and
// a NUL would cut short every C string a name or a message naming it becomes (the C API's
// optfuse_last_error). Other control characters are allowed: both printed forms escape them.
#include <cstddef>
#include <string>
#include <string_view>

namespace optfuse {

// Throws Error unless `name` is valid UTF-8 (RFC 3629: no overlong forms, surrogates or code
// points above U+10FFFF) without NUL, e.g. `param name "p\xff" is not valid UTF-8: byte 0xff at
// offset 1 is never valid in UTF-8`. `what` says which name it is ("param name").
void check_name(std::string_view name, std::string_view what);

// The offset of the first byte of the first ill-formed sequence in `s`, or npos; `why` (if not
// null) says what is wrong with it.
size_t invalid_utf8_at(std::string_view s, const char** why = nullptr);

// `s` in double quotes as the text form writes it (graph.h) and messages show it: '"' and '\'
// backslashed, control bytes and bytes outside valid UTF-8 as \xHH, so the result is always
// valid UTF-8 and parses back to `s`.
std::string quote_name(std::string_view s);

// `s` with every byte outside valid UTF-8 written as \xHH: for messages that quote raw input
// (nlohmann's parse errors show the bytes last read).
std::string escape_invalid_utf8(std::string_view s);

}  // namespace optfuse
