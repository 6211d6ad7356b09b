#pragma once
// CLI11 checks whose messages say what is wrong with a value ("--steps: 'abc' is not a number",
// "--steps: 0 is not in the range 1 to 100000"); CLI11's own Range says "not in range" for both.
// A failed check is a usage error (exit status 2, tools/main.cpp).
#include <CLI/CLI.hpp>
#include <cstdint>

namespace optfuse::tools {

CLI::Validator whole_number_in(int64_t min, int64_t max);
CLI::Validator number_in(double min, double max);
// A size as parse_size() reads it (include/optfuse/cache.h): "512M", "1G", "1000".
CLI::Validator size_text();
// Halide target strings, comma-separated ("host", "x86-64-linux-avx2,arm-64-linux").
CLI::Validator target_list();
// An optimizer: a name of optimizer_types(), or a JSON config with a known "type".
CLI::Validator optimizer_config();

}  // namespace optfuse::tools
