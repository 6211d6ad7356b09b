#include "graph/names.h"

#include "optfuse/error.h"

namespace optfuse {
namespace {

const char kHex[] = "0123456789abcdef";

std::string hex_byte(unsigned char c) { return {'0', 'x', kHex[c >> 4], kHex[c & 15]}; }

// The length (1-4) of the well-formed UTF-8 character at s[i], or 0 with `why` set.
size_t char_length(std::string_view s, size_t i, const char** why) {
  const auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) return 1;
  size_t n = 0;
  unsigned lo = 0x80, hi = 0xbf;   // the range of the second byte (RFC 3629, table 3-7)
  const char* narrowed = nullptr;  // what a second byte outside [lo, hi] but a continuation means
  if (c < 0xc0) {
    *why = "is a continuation byte without a lead byte";
    return 0;
  } else if (c < 0xc2) {
    *why = "starts an overlong encoding";
    return 0;
  } else if (c < 0xe0) {
    n = 2;
  } else if (c < 0xf0) {
    n = 3;
    if (c == 0xe0) lo = 0xa0, narrowed = "starts an overlong encoding";
    if (c == 0xed) hi = 0x9f, narrowed = "starts a UTF-16 surrogate";
  } else if (c < 0xf5) {
    n = 4;
    if (c == 0xf0) lo = 0x90, narrowed = "starts an overlong encoding";
    if (c == 0xf4) hi = 0x8f, narrowed = "starts a code point above U+10FFFF";
  } else {
    *why = "is never valid in UTF-8";
    return 0;
  }
  for (size_t k = 1; k < n; ++k) {
    const unsigned d = i + k < s.size() ? static_cast<unsigned char>(s[i + k]) : 0;
    const bool continuation = d >= 0x80 && d <= 0xbf;
    if (!continuation || (k == 1 && (d < lo || d > hi))) {
      *why = continuation ? narrowed : "starts a character that is cut short";
      return 0;
    }
  }
  return n;
}

// `s` with ill-formed bytes (and if `quoted`: control bytes, '"' and '\') escaped, as \xHH.
std::string escaped(std::string_view s, bool quoted) {
  std::string out;
  const char* why = nullptr;
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = char_length(s, i, &why);
    if (quoted && (c == '"' || c == '\\')) {
      out += '\\';
      out += static_cast<char>(c);
    } else if (n == 0 || (quoted && (c < 0x20 || c == 0x7f))) {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out.append(s.data() + i, n);
      i += n;
      continue;
    }
    ++i;
  }
  return out;
}

}  // namespace

size_t invalid_utf8_at(std::string_view s, const char** why) {
  const char* ignored = nullptr;
  for (size_t i = 0; i < s.size();) {
    size_t n = char_length(s, i, why ? why : &ignored);
    if (n == 0) return i;
    i += n;
  }
  return std::string_view::npos;
}

void check_name(std::string_view name, std::string_view what) {
  const char* why = nullptr;
  const size_t bad = invalid_utf8_at(name, &why);
  const std::string prefix = std::string(what) + " " + quote_name(name);
  if (bad != std::string_view::npos)
    throw Error(prefix + " is not valid UTF-8: byte " +
                hex_byte(static_cast<unsigned char>(name[bad])) + " at offset " +
                std::to_string(bad) + " " + why);
  if (size_t nul = name.find('\0'); nul != std::string_view::npos)
    throw Error(prefix + " contains NUL at byte offset " + std::to_string(nul) +
                " (names are UTF-8 text without NUL)");
}

std::string quote_name(std::string_view s) { return "\"" + escaped(s, true) + "\""; }

std::string escape_invalid_utf8(std::string_view s) { return escaped(s, false); }

}  // namespace optfuse
