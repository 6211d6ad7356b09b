#pragma once
// The JSON form of a Graph as nlohmann::json values (the format: docs/graph-json.md; the string
// forms parse_json / print_json are in graph.h). For callers that already hold parsed JSON, e.g.
// a custom optimizer's definition.
#include <nlohmann/json.hpp>
#include <string>

#include "optfuse/graph.h"

namespace optfuse::graph_json {

// Errors are optfuse::Error prefixed with the JSON pointer of the bad value, after `where`
// (e.g. "optimizer config: /graph/nodes/3/args/1: ...").
Graph from_json(const nlohmann::json& j, const std::string& where = "");
nlohmann::json to_json(const Graph& g);

// `v` as JSON text for an error message: never throws (invalid UTF-8, which only a value built in
// C++ can hold, becomes U+FFFD; dump() would throw).
std::string message_text(const nlohmann::json& v);

// Throws Error("<what>: JSON nested deeper than 64 levels") for a deeper `v`: nlohmann copies,
// compares and dumps values recursively, so a deep one would overflow the stack. (No optfuse JSON
// goes deeper than about 8.) Checked without recursion.
void check_nesting(const nlohmann::json& v, const std::string& what);

}  // namespace optfuse::graph_json
