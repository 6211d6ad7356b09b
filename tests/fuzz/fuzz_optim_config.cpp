// libFuzzer target: the optimizer config parser, optim::parse_config (src/optim/config.h), on
// any JSON value (text that is not JSON is nlohmann's business and skipped). Checks as
// fuzz_checks.h says, on the rule's graph for the config's defaults; and the config itself must
// round-trip: written out with every default filled in, then read back, it gives the same
// defaults, step options and graph.
#include <cstddef>
#include <cstdint>

#include "fuzz_checks.h"
#include "optim/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace optfuse;
  const Options config = Options::parse(reinterpret_cast<const char*>(data),
                                        reinterpret_cast<const char*>(data) + size, nullptr,
                                        /*allow_exceptions=*/false);
  if (config.is_discarded()) return 0;
  optim::ParsedConfig parsed;
  try {
    parsed = optim::parse_config(config);
  } catch (const Error& e) {
    fuzz::check_rejection(e);
    return 0;
  }
  const std::string input = config.dump();
  const Graph g = fuzz::must("rule->graph(defaults)", input,
                             [&] { return parsed.rule->graph(parsed.defaults); });
  fuzz::check_round_trips(g);

  Options full = config;
  for (const auto& [name, value] : parsed.defaults.items()) full[name] = value;
  const std::string text = fuzz::must("dump", input, [&] { return full.dump(); });
  const Options back = Options::parse(text, nullptr, false);
  if (back.is_discarded()) fuzz::crash("the filled-in config does not parse as JSON", text);
  optim::ParsedConfig again =
      fuzz::must("parse_config(filled-in config)", text, [&] { return optim::parse_config(back); });
  if (again.defaults != parsed.defaults)
    fuzz::crash("the filled-in config has other defaults", text + "\n" + again.defaults.dump());
  if (again.step.to_json() != parsed.step.to_json())
    fuzz::crash("the filled-in config has other step options", text);
  const Graph g2 = fuzz::must("rule->graph(defaults), filled in", text,
                              [&] { return again.rule->graph(again.defaults); });
  if (structural_hash(g2) != structural_hash(g))
    fuzz::crash("the filled-in config has another graph", text + "\n" + print(g) + print(g2));
  return 0;
}
