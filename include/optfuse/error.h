#pragma once
// optfuse's one exception type. User errors (bad input) say what is at fault and change no state;
// internal errors (a bug in optfuse) start with "internal error:".
#include <stdexcept>
#include <string>

namespace optfuse {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A file could not be read or written, or its content is corrupt.
class IoError : public Error {
 public:
  using Error::Error;
};

// Throws Error("internal error: <what>") — for broken invariants, never for user input.
[[noreturn]] void internal_error(const std::string& what);

}  // namespace optfuse
