// libFuzzer target: the graph JSON parser, optfuse::parse_json (docs/graph-json.md). Checks as
// fuzz_checks.h says; seeds: corpus/graph_json/.
#include <cstddef>
#include <cstdint>

#include "fuzz_checks.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace optfuse;
  Graph g;
  try {
    g = parse_json(std::string_view(reinterpret_cast<const char*>(data), size));
  } catch (const Error& e) {
    fuzz::check_rejection(e);
    return 0;
  }
  fuzz::check_round_trips(g);
  return 0;
}
