#pragma once
// What every fuzz target checks (tests/fuzz/README.md). Bad input may be rejected with an
// optfuse::Error whose message is valid UTF-8 (messages show names quoted, graph/names.h) and
// does not report a bug ("internal error: ..."). Anything else thrown escapes the target and
// aborts; a graph that parsed must survive print -> parse in both forms (same text, same
// structural hash, same name). A failed check prints what it saw and aborts, which libFuzzer
// reports as a crash with the input saved.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "graph/names.h"
#include "optfuse/error.h"
#include "optfuse/graph.h"
#include "optfuse/idioms.h"

namespace optfuse::fuzz {

[[noreturn]] inline void crash(const std::string& what, const std::string& detail) {
  std::fprintf(stderr, "\n*** fuzz check failed: %s\n%s\n", what.c_str(), detail.c_str());
  std::fflush(stderr);
  std::abort();
}

inline void check_rejection(const Error& e) {
  const std::string what = e.what();
  if (what.rfind("internal error", 0) == 0) crash("an internal error", what);
  if (invalid_utf8_at(what) != std::string_view::npos)
    crash("a message that is not valid UTF-8", quote_name(what));
}

// `f()` where failure is a bug: an Error here is a crash, reported with `context`.
template <typename F>
auto must(const char* step, const std::string& context, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const Error& e) {
    crash(std::string(step) + " threw: " + e.what(), context);
  }
}

inline void check_round_trips(const Graph& g) {
  const std::string text = must("print", "", [&] { return print(g); });
  const Graph t = must("parse(print(g))", text, [&] { return parse(text); });
  if (print(t) != text) crash("print(parse(print(g))) != print(g)", text + "---\n" + print(t));
  const Hash128 hash = must("structural_hash", text, [&] { return structural_hash(g); });
  const std::string canonical = print(canonicalize(g));
  if (structural_hash(t) != hash) crash("the text form changed the structural hash", text);

  const std::string json = must("print_json", text, [&] { return print_json(g); });
  const Graph j = must("parse_json(print_json(g))", json, [&] { return parse_json(json); });
  if (j.name() != g.name()) crash("the JSON form changed the name", json);
  if (structural_hash(j) != hash || print(canonicalize(j)) != canonical)
    crash("the JSON form changed the graph", text + "---\n" + json);
  // Read back, the JSON form lists inputs, scalars, then nodes, as it prints them: a fixed point.
  const std::string json2 = print_json(j);
  const Graph j2 =
      must("parse_json(print_json(parse_json(...)))", json2, [&] { return parse_json(json2); });
  if (print_json(j2) != json2) crash("the JSON form is not a fixed point", json2);

  // Passes over parsed graphs may reject a graph, but only with a user Error.
  try {
    normalize(g);
  } catch (const Error& e) {
    check_rejection(e);
  }
}

}  // namespace optfuse::fuzz
