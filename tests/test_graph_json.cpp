// The JSON graph form: round trips (every library graph, odd dtypes, constants such as nan),
// generic op lookup, and errors that name the JSON path of the bad value.
#include <gtest/gtest.h>

#include "graph/json.h"
#include "optfuse/error.h"
#include "optfuse/graph.h"
#include "optfuse/optim.h"

namespace optfuse {
namespace {

void expect_round_trip(const Graph& g) {
  Graph back = parse_json(print_json(g));
  EXPECT_EQ(print(canonicalize(back)), print(canonicalize(g)));
  EXPECT_EQ(structural_hash(back), structural_hash(g));
  EXPECT_EQ(back.name(), g.name());
  EXPECT_EQ(back.results().size(), g.results().size());
}

TEST(GraphJson, LibraryGraphsRoundTrip) {
  for (const std::string& type : optimizer_types())
    expect_round_trip(update_graph({{"type", type}}));
  expect_round_trip(update_graph({{"type", "sgd"}, {"momentum", 0.9}, {"nesterov", true}}));
  expect_round_trip(update_graph({{"type", "adamw"}, {"amsgrad", true}}));
}

TEST(GraphJson, DtypesCastsBoolScalarsAndSpecialConstantsRoundTrip) {
  Graph g = parse(R"(graph "odd" {
    %0 = param.bf16 "p"
    %1 = grad.f16 "g"
    %2 = scalar.bool "flag"
    %3 = scalar.f64 "s"
    %4 = cast.f32 %1
    %5 = const.f32 nan
    %6 = const.f32 -inf
    %7 = max.f32 %4, %6
    %8 = select.f32 %2, %7, %5
    %9 = cast.f64 %8
    %10 = mul.f64 %9, %3
    %11 = cast.bf16 %10
    out "p" = %11
  })");
  expect_round_trip(g);
}

TEST(GraphJson, ReductionsAndResultsRoundTrip) {
  Graph g = parse(R"(graph "stats" {
    %0 = param.f32 "p"
    %1 = grad.f32 "g"
    %2 = row_mean.f32 %1
    %3 = sub.f32 %1, %2
    %4 = mul.f32 %3, %3
    %5 = reduce_sum.f32 %4
    %6 = sub.f32 %0, %3
    out "p" = %6
    result "sumsq" = %5
  })");
  expect_round_trip(g);
  Graph stats = parse_json(R"({
    "inputs": [{"name": "g", "role": "grad"}],
    "nodes": [{"id": "sq", "op": "mul", "args": ["g", "g"]},
              {"id": "s", "op": "reduce_sum", "args": ["sq"]}],
    "results": {"sumsq": "s"}
  })");
  EXPECT_EQ(stats.results().size(), 1u);
  EXPECT_TRUE(stats.outputs().empty());
}

TEST(GraphJson, ReadsTheDocumentedExample) {
  Graph g = parse_json(R"({
    "name": "sgd",
    "inputs": [{"name": "p", "role": "param"}, {"name": "g", "role": "grad"}],
    "scalars": ["lr"],
    "nodes": [{"id": "step", "op": "mul", "args": ["lr", "g"]},
              {"id": "p1", "op": "sub", "args": ["p", "step"]}],
    "outputs": {"p": "p1"}
  })");
  Graph want = parse(R"(graph "sgd" {
    %0 = param.f32 "p"
    %1 = grad.f32 "g"
    %2 = scalar.f32 "lr"
    %3 = mul.f32 %2, %1
    %4 = sub.f32 %0, %3
    out "p" = %4
  })");
  EXPECT_EQ(structural_hash(g), structural_hash(want));
}

TEST(GraphJson, NumberOperandsAdoptTheOtherOperandsDtype) {
  Graph g = parse_json(R"({
    "inputs": [{"name": "p", "role": "param", "dtype": "f64"}],
    "nodes": [{"id": "h", "op": "mul", "args": [0.5, "p"]}],
    "outputs": {"p": "h"}
  })");
  EXPECT_EQ(g.node(g.outputs()[0].value).dtype, DType::F64);
}

void expect_error(const std::string& json, const std::string& fragment) {
  try {
    parse_json(json);
    FAIL() << "expected an Error containing: " << fragment;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(GraphJson, ErrorsNameTheJsonPath) {
  const std::string head = R"({"inputs": [{"name": "p", "role": "param"}], "scalars": ["lr"], )";
  expect_error(
      head + R"("nodes": [{"id": "a", "op": "mul", "args": ["lr", "q"]}], "outputs": {"p": "a"}})",
      "graph JSON /nodes/0/args/1: \"q\" is not defined");
  expect_error(
      head + R"("nodes": [{"id": "a", "op": "fma", "args": ["lr", "p"]}], "outputs": {"p": "a"}})",
      "/nodes/0/op: unknown op \"fma\"");
  expect_error(
      head + R"("nodes": [{"id": "a", "op": "sqrt", "args": ["lr", "p"]}], "outputs": {"p": "a"}})",
      "/nodes/0/args: sqrt takes 1 operands, got 2");
  expect_error(
      head + R"("nodes": [{"id": "lr", "op": "neg", "args": ["p"]}], "outputs": {"p": "lr"}})",
      "/nodes/0: \"lr\" is already defined");
  expect_error(
      head +
          R"("nodes": [{"id": "a", "op": "neg", "args": ["p"], "attrs": {"axis": 1}}], "outputs": {"p": "a"}})",
      "/nodes/0/attrs: neg takes no attributes");
  expect_error(head + R"("nodes": [], "outputs": {"lr": "p"}})", "/outputs/lr: output \"lr\"");
  expect_error(R"({"inputs": [{"name": "p", "role": "weights"}], "outputs": {}})",
               "/inputs/0/role: expected param, grad, state, row_state or col_state");
  expect_error(R"({"inputs": [{"name": "p", "role": "param", "dtype": "f8"}], "outputs": {}})",
               "/inputs/0/dtype: unknown dtype \"f8\"");
  expect_error(R"({"inputs": [], "outputs": {}, "extra": 1})", "/extra: unknown field");
  expect_error(R"({"inputs": []})", "/outputs: missing");
  expect_error(R"([1, 2])", "graph JSON /: a graph must be a JSON object");
  expect_error(R"({"inputs": [)", "not valid JSON");
  // Graph-level errors (dtypes) carry the node's path too.
  expect_error(
      R"({"inputs": [{"name": "p", "role": "param"}, {"name": "g", "role": "grad", "dtype": "f64"}],
                   "nodes": [{"id": "a", "op": "add", "args": ["p", "g"]}], "outputs": {"p": "a"}})",
      "/nodes/0: add: operand 2 has dtype f64");
}

// Issue 16: the text parser took names that are not UTF-8, and print_json then threw nlohmann's
// type_error instead of an optfuse::Error. Now such a name never gets into a graph.
TEST(GraphJson, NamesThatAreNotUtf8AreRejectedWhereTheyEnter) {
  try {
    Graph g = parse("graph \"g\" {\n %0 = param.f32 \"caf\\xe9\"\n out \"caf\\xe9\" = %0 }");
    print_json(g);
    FAIL() << "parsed without error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "line 2: param name \"caf\\xe9\" is not valid UTF-8: byte 0xe9 at offset 3 starts a "
              "character that is cut short");
  }
  // JSON text is UTF-8 by nlohmann's parser; a JSON value built in C++ is checked here.
  using nlohmann::json;
  auto error_of = [](const json& j) {
    try {
      graph_json::from_json(j);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    ADD_FAILURE() << "no Error";
    return std::string();
  };
  const json p = {{"name", "p"}, {"role", "param"}};
  EXPECT_EQ(error_of({{"name", "\xff"}, {"inputs", json::array()}, {"outputs", json::object()}}),
            "graph JSON /name: graph name \"\\xff\" is not valid UTF-8: byte 0xff at offset 0 is "
            "never valid in UTF-8");
  EXPECT_EQ(error_of({{"inputs", json::array({{{"name", "p\xc3"}, {"role", "param"}}})},
                      {"outputs", json::object()}}),
            "graph JSON /inputs/0: param name \"p\\xc3\" is not valid UTF-8: byte 0xc3 at offset 1 "
            "starts a character that is cut short");
  EXPECT_EQ(error_of({{"inputs", json::array({p})},
                      {"scalars", json::array({"l\x80"})},
                      {"outputs", json::object()}}),
            "graph JSON /scalars/0: scalar name \"l\\x80\" is not valid UTF-8: byte 0x80 at offset "
            "1 is a continuation byte without a lead byte");
  EXPECT_EQ(error_of({{"inputs", json::array({p})},
                      {"nodes", json::array({{{"id", "n\xff"}, {"op", "neg"}, {"args", {"p"}}}})},
                      {"outputs", json::object()}}),
            "graph JSON /nodes/0/id: node id \"n\\xff\" is not valid UTF-8: byte 0xff at offset 1 "
            "is never valid in UTF-8");
  EXPECT_EQ(error_of({{"inputs", json::array({p})}, {"outputs", json::object({{"p\xff", "p"}})}}),
            "graph JSON /outputs: output name \"p\\xff\" is not valid UTF-8: byte 0xff at offset 1 "
            "is never valid in UTF-8");
  EXPECT_EQ(error_of({{"inputs", json::array({p})}, {"results", json::object({{"\xff", "p"}})}}),
            "graph JSON /results: result name \"\\xff\" is not valid UTF-8: byte 0xff at offset 0 "
            "is never valid in UTF-8");
  EXPECT_EQ(
      error_of({{"inputs", json::array({p})},
                {"scalars", json::array({std::string("s\0", 2)})},
                {"outputs", json::object()}}),
      "graph JSON /scalars/0: scalar name \"s\\x00\" contains NUL at byte offset 1 (names are "
      "UTF-8 text without NUL)");
  // A message that shows such a value replaces the bad byte (dump() would throw).
  EXPECT_EQ(
      error_of({{"inputs", json::array({json::array({"x\xff", 1})})}, {"outputs", json::object()}}),
      "graph JSON /inputs/0: must be an object, got array [\"x\xef\xbf\xbd\",1]");
}

// Found by fuzz_graph_text: an opaque op lost its callee in JSON and could not be read back.
TEST(GraphJson, OpaqueOpsKeepTheirCallee) {
  Graph g("ext");
  Value p = g.param("p"), gr = g.grad("g");
  g.output("p", p - opaque("all_reduce", gr) * 0.5);
  const std::string json = print_json(g);
  int callees = 0;
  const nlohmann::json parsed = nlohmann::json::parse(json);
  for (const auto& node : parsed["nodes"])
    if (node.value("op", "") == "opaque")
      callees += node["attrs"] == nlohmann::json{{"callee", "all_reduce"}};
  EXPECT_EQ(callees, 1) << json;
  Graph back = parse_json(json);
  EXPECT_EQ(structural_hash(back), structural_hash(g));
  EXPECT_EQ(print(back), print(parse(print(back))));
  const std::string head =
      R"({"inputs": [{"name": "g", "role": "grad"}], "outputs": {}, "nodes": [{"id": "x", "op": "opaque", "args": ["g"])";
  expect_error(head + "}]}",
               "/nodes/0/attrs: opaque takes one attribute, \"callee\" (the external computation)");
  expect_error(head + R"(, "attrs": {"callee": 1}}]})",
               "/nodes/0/attrs/callee: must be a string, got number 1");
  expect_error(head + R"(, "attrs": {"callee": ""}}]})",
               "/nodes/0: opaque: the name of the external computation must not be empty");
}

// Found by fuzz_graph_json: nlohmann's parse errors quote the bytes last read, UTF-8 or not.
TEST(GraphJson, MessagesAboutBadJsonAreUtf8) {
  expect_error("{\"inputs\": \xec}", "last read: '\"inputs\": \\xec'");
}

// nlohmann copies, compares and dumps recursively: a deep value would overflow the stack.
TEST(GraphJson, DeepNestingIsAnError) {
  const std::string deep(100000, '[');
  expect_error(R"({"inputs": )" + deep + std::string(100000, ']') + "}",
               "graph JSON: JSON nested deeper than 64 levels");
  nlohmann::json nested = nlohmann::json::array();
  for (int i = 0; i < 70; ++i) nested = nlohmann::json::array({nested});
  try {
    graph_json::from_json({{"inputs", nested}}, "custom optimizer 'x'");
    FAIL() << "no Error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "custom optimizer 'x': graph JSON: JSON nested deeper than 64 levels");
  }
}

// Ids share one namespace in JSON: a node whose "%N" id is some leaf's name gets another id.
TEST(GraphJson, NodeIdsNeverCollideWithLeafNames) {
  Graph g("collide");
  Value p = g.param("%2"), s = g.scalar("%2'");
  g.output("%2", p * s * 0.5);
  const std::string json = print_json(g);
  EXPECT_NE(json.find("\"%2''\""), std::string::npos) << json;
  expect_round_trip(g);
}

}  // namespace
}  // namespace optfuse
