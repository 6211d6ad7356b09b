// The textual form: exact printing, print/parse round trips (every op in ops.def), tolerance of
// whitespace and comments, and parse errors that carry a line number and say what was expected.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "optfuse/error.h"
#include "optfuse/graph.h"

namespace optfuse {
namespace {

using ::testing::HasSubstr;

const Op kAllOps[] = {
#define OPTFUSE_OP(e, text, arity, flags) Op::e,
#include "optfuse/ops.def"
#undef OPTFUSE_OP
};
const DType kAllDTypes[] = {DType::F32, DType::F64, DType::F16, DType::BF16, DType::Bool};

uint64_t bits_of(double v) {
  uint64_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

// One node of every non-leaf op in ops.def (operands chosen from arity and flags, so a new op is
// covered as soon as it is added), every role and dtype, and constants that are hard to print.
Graph every_op_graph() {
  Graph g("every op");
  Value x = g.param("x"), y = g.grad("y"), lr = g.scalar("lr");
  g.state("m", DType::BF16);
  g.state("v", DType::F16);
  Value d = g.state("d", DType::F64);
  g.scalar("flag", DType::Bool);
  Value cond = x < y;
  for (Op op : kAllOps) {
    if (op_has(op, kLeaf)) continue;
    if (op == Op::Cast) {
      for (DType t : kAllDTypes) g.make(op, {x}, t);
    } else if (op == Op::RoundSR) {
      g.make(op, {x, g.scalar("key", DType::F64)});
    } else if (op == Op::Opaque) {
      opaque("all \"reduce\"", x);  // a name that needs escaping
    } else if (op_arity(op) == 1) {
      g.make(op, {x});
    } else if (op_arity(op) == 2) {
      g.make(op, {x, lr});
    } else if (op == Op::Select) {
      g.make(op, {cond, x, y});
    } else {
      ADD_FAILURE() << "every_op_graph does not know operands for " << op_name(op);
    }
  }
  Value scaled = d;
  for (double v : {0.1, -0.0, 1.0 / 3, 5e-324, DBL_MAX, 1e-300, HUGE_VAL, -HUGE_VAL, std::nan("")})
    scaled = scaled * v;
  g.output("d", scaled);
  for (DType t : kAllDTypes) g.constant(0.1, t);
  g.output("x", x - lr * y);
  return g;
}

void expect_same_nodes(const Graph& a, const Graph& b) {
  ASSERT_EQ(a.nodes().size(), b.nodes().size());
  for (size_t i = 0; i < a.nodes().size(); ++i) {
    const Node &m = a.nodes()[i], &n = b.nodes()[i];
    EXPECT_EQ(m.op, n.op) << i;
    EXPECT_EQ(m.dtype, n.dtype) << i;
    EXPECT_EQ(m.is_tensor, n.is_tensor) << i;
    EXPECT_EQ(m.args, n.args) << i;
    EXPECT_EQ(bits_of(m.value), bits_of(n.value)) << i;
    EXPECT_EQ(m.name, n.name) << i;
    EXPECT_EQ(m.role, n.role) << i;
  }
  ASSERT_EQ(a.outputs().size(), b.outputs().size());
  for (size_t i = 0; i < a.outputs().size(); ++i) {
    EXPECT_EQ(a.outputs()[i].replaces, b.outputs()[i].replaces);
    EXPECT_EQ(a.outputs()[i].value, b.outputs()[i].value);
  }
}

TEST(Print, DocumentedFormat) {
  Graph g("sgd");
  Value p = g.param("p"), gr = g.grad("g"), lr = g.scalar("lr");
  g.output("p", p - cast(cast(gr * lr, DType::BF16), DType::F32) * 0.5);
  EXPECT_EQ(print(g), R"(graph "sgd" {
  %0 = param.f32 "p"
  %1 = grad.f32 "g"
  %2 = scalar.f32 "lr"
  %3 = mul.f32 %1, %2
  %4 = cast.bf16 %3
  %5 = cast.f32 %4
  %6 = const.f32 0.5
  %7 = mul.f32 %5, %6
  %8 = sub.f32 %0, %7
  out "p" = %8
}
)");
}

TEST(Print, ConstantsUsePercent17gAndNamedSpecials) {
  for (double v : {0.1, 1.0 / 3, 5e-324, DBL_MAX, 1e-300, 1e22, 123456789.0, -0.0, 2.5}) {
    Graph g;
    g.constant(v, DType::F64);
    char want[64];
    std::snprintf(want, sizeof want, "%.17g", v);
    EXPECT_THAT(print(g), HasSubstr(std::string("const.f64 ") + want + "\n"));
  }
  Graph g;
  g.constant(HUGE_VAL);
  g.constant(-HUGE_VAL);
  g.constant(-NAN);
  EXPECT_THAT(print(g), HasSubstr("const.f32 inf\n  %1 = const.f32 -inf\n  %2 = const.f32 nan\n"));
}

TEST(RoundTrip, EveryOpPrintsAndParsesIdentically) {
  Graph g = every_op_graph();
  const std::string text = print(g);
  for (Op op : kAllOps) {
    std::string word = op == Op::Input ? "param." : std::string(op_name(op)) + ".";
    EXPECT_THAT(text, HasSubstr(" = " + word)) << "op missing from the test graph";
  }
  Graph back = parse(text);
  EXPECT_EQ(back.name(), g.name());
  EXPECT_EQ(print(back), text);
  expect_same_nodes(g, back);
}

TEST(RoundTrip, NamesWithQuotesBackslashesAndControlCharacters) {
  Graph g("we\"ird\\ \tname # not a comment");
  Value p = g.param("p\"1\"\n"), lr = g.scalar("l\\r\x7f");
  g.output("p\"1\"\n", p * lr);
  const std::string text = print(g);
  EXPECT_THAT(text, HasSubstr(R"(graph "we\"ird\\ \x09name # not a comment" {)"));
  EXPECT_THAT(text, HasSubstr(R"(%0 = param.f32 "p\"1\"\x0a")"));
  Graph back = parse(text);
  EXPECT_EQ(back.name(), g.name());
  EXPECT_EQ(print(back), text);
  expect_same_nodes(g, back);
}

TEST(RoundTrip, Utf8NamesAreWrittenAsTheyAre) {
  // 2-, 3- and 4-byte characters and the last code point; C1 controls are valid UTF-8 too.
  const std::string name = "\xc3\xbc \xe6\x97\xa5 \xf0\x9f\x98\x80 \xf4\x8f\xbf\xbf \xc2\x85";
  Graph g(name);
  Value p = g.param(name);
  g.output(name, -p);
  const std::string text = print(g);
  EXPECT_THAT(text, HasSubstr("%0 = param.f32 \"" + name + "\"\n"));
  Graph back = parse(text);
  EXPECT_EQ(back.name(), name);
  EXPECT_EQ(print(back), text);
  // The same bytes written as escapes read the same.
  EXPECT_EQ(print(parse("graph \"\\xc3\\xbc\" {}")), "graph \"\xc3\xbc\" {\n}\n");
}

TEST(Parse, ToleratesWhitespaceAndComments) {
  Graph g = parse(R"(
    # an SGD step
    graph "sgd"{
    %0=param.f32 "p"   # the weights
	%1 = grad.f32"g"
      %2 = scalar.f32 "lr"

    %3 = mul.f32 %1 ,%2  %4 = sub.f32 %0, %3
      out "p"=%4 # in place
    }   # done
  )");
  EXPECT_EQ(print(g), R"(graph "sgd" {
  %0 = param.f32 "p"
  %1 = grad.f32 "g"
  %2 = scalar.f32 "lr"
  %3 = mul.f32 %1, %2
  %4 = sub.f32 %0, %3
  out "p" = %4
}
)");
}

TEST(Parse, LabelsNeedNotBeDenseAndDuplicatesAreShared) {
  Graph g = parse(R"(graph "g" {
    %10 = param.f32 "p"
    %7 = const.f32 2
    %3 = const.f32 2.0
    %1 = mul.f32 %10, %3
    out "p" = %1
  })");
  EXPECT_EQ(g.nodes().size(), 3u);
  EXPECT_EQ(g.node(g.outputs()[0].value).args[1], 1);
}

TEST(Parse, ConstantsAreRoundedToTheirDtype) {
  Graph g = parse("graph \"g\" { %0 = const.f32 0.1 %1 = const.bf16 3.0078125 }");
  EXPECT_EQ(g.node(0).value, double(0.1f));
  EXPECT_EQ(g.node(1).value, 3.0);
}

struct BadText {
  std::string text;
  std::string error;
};

class ParseError : public ::testing::TestWithParam<BadText> {};

TEST_P(ParseError, SaysWhereAndWhat) {
  try {
    parse(GetParam().text);
    FAIL() << "parsed without error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), GetParam().error);
  }
}

constexpr const char* kPrefix = "graph \"g\" {\n  %0 = param.f32 \"p\"\n";  // lines 1-2

INSTANTIATE_TEST_SUITE_P(
    Text, ParseError,
    ::testing::Values(
        BadText{"grph \"g\" {}", "line 1: expected 'graph', got 'grph'"},
        BadText{"graph g {}", "line 1: expected the graph name in quotes, got 'g'"},
        BadText{"graph \"g\"\n\n%0", "line 3: expected '{', got '%0'"},
        BadText{"graph \"g {}", "line 1: unterminated string"},
        BadText{"graph \"a\\qb\" {}",
                "line 1: bad escape in string (expected \\\", \\\\ or \\xHH)"},
        BadText{"graph \"g\" {\n  %0 = param.f32 \"p\"\n",
                "line 3: expected '%N = ...', 'out \"name\" = %N', 'result "
                "\"name\" = %N' or '}', got end of input"},
        BadText{"graph \"g\" {} }", "line 1: expected end of input after '}', got '}'"},
        BadText{"graph \"g\" {\n %0 param.f32 \"p\" }", "line 2: expected '=', got 'param.f32'"},
        BadText{"graph \"g\" {\n %0 = param.f12 \"p\" }",
                "line 2: expected 'op.dtype' with dtype f32, f64, f16, bf16 or bool, got "
                "'param.f12'"},
        BadText{"graph \"g\" {\n %0 = input.f32 \"p\" }",
                "line 2: unknown op 'input' (inputs are written param, grad, state, row_state or "
                "col_state)"},
        BadText{"graph \"g\" {\n\n %0 = frob.f32 \"p\" }",
                "line 3: unknown op 'frob' (inputs are written param, grad, state, row_state or "
                "col_state)"},
        BadText{"graph \"g\" {\n %0 = param.f32 p }", "line 2: expected a name in quotes, got 'p'"},
        BadText{"graph \"g\" {\n %0 = const.f32 0.5x }", "line 2: expected a number, got '0.5x'"},
        BadText{"graph \"g\" {\n %0 = const.f64 1e-400 }",
                "line 2: the number '1e-400' is out of range for a double"},
        BadText{"graph \"g\" {\n %0 = const.f32 \"x\" }", "line 2: expected a number, got \"x\""},
        BadText{"graph \"g\" {\n %0 = param.f32 \"p\"\n %0 = grad.f32 \"g\" }",
                "line 3: %0 is already defined"},
        BadText{"graph \"g\" {\n %0 = param.f32 \"p\"\n %1 = grad.f32 \"p\" }",
                "line 3: grad: the name \"p\" is already declared"},
        BadText{"graph \"g\" {\n %0 = param.f32 \"p\"\n %1 = neg.f32 %2 }",
                "line 3: %2 is used before it is defined"},
        BadText{"graph \"g\" {\n %0 = param.f32 \"p\"\n %1 = add.f32 %0 %0 }",
                "line 3: expected ',', got '%0'"},
        BadText{"graph \"g\" {\n %0 = param.f32 \"p\"\n %1 = neg.f32 % }",
                "line 3: expected digits after '%'"},
        BadText{"graph \"g\" {\n %0 = param.f32 \"p\"\n %1 = grad.f64 \"g\"\n"
                " %2 = add.f32 %0, %1 }",
                "line 4: add: operand 2 has dtype f64 but operand 1 has f32"},
        BadText{"graph \"g\" {\n %0 = param.f32 \"p\"\n %1 = add.f64 %0, %0 }",
                "line 3: add: result dtype f64 should be f32"},
        BadText{"graph \"g\" {\n %0 = param.f32 \"p\"\n %1 = lt.f32 %0, %0 }",
                "line 3: lt: result dtype f32 should be bool"},
        BadText{"graph \"g\" {\n %0 = param.f32 \"p\"\n out \"q\" = %0 }",
                "line 3: output \"q\": no tensor input has that name"},
        BadText{"graph \"g\" {\n %0 = param.f32 \"p\"\n out \"p\" = %0\n out \"p\" = %0 }",
                "line 4: output \"p\": the input is already replaced"},
        BadText{"graph \"g\" {\n %0 = param.f32 \"p\"\n out p = %0 }",
                "line 3: expected the replaced input's name in quotes, got 'p'"},
        // Names are UTF-8 text without NUL (graph.h), escaped or not; messages stay UTF-8.
        BadText{"graph \"g\\xff\" {}",
                "line 1: graph name \"g\\xff\" is not valid UTF-8: byte 0xff at offset 1 is never "
                "valid in UTF-8"},
        BadText{"graph \"g\" {\n %0 = param.f32 \"\xc3(\" }",
                "line 2: param name \"\\xc3(\" is not valid UTF-8: byte 0xc3 at offset 0 starts a "
                "character that is cut short"},
        BadText{"graph \"g\" {\n %0 = scalar.f32 \"lr\\xed\\xa0\\x80\" }",
                "line 2: scalar name \"lr\\xed\\xa0\\x80\" is not valid UTF-8: byte 0xed at offset "
                "2 starts a UTF-16 surrogate"},
        BadText{"graph \"g\" {\n %0 = state.f32 \"m\\x00\" }",
                "line 2: state name \"m\\x00\" contains NUL at byte offset 1 (names are UTF-8 text "
                "without NUL)"},
        BadText{std::string(kPrefix) + " out \"\x80\" = %0 }",
                "line 3: output name \"\\x80\" is not valid UTF-8: byte 0x80 at offset 0 is a "
                "continuation byte without a lead byte"},
        BadText{std::string(kPrefix) + " %1 = reduce_sum.f32 %0\n result \"\xc0\xaf\" = %1 }",
                "line 4: result name \"\\xc0\\xaf\" is not valid UTF-8: byte 0xc0 at offset 0 "
                "starts an overlong encoding"},
        BadText{std::string(kPrefix) + " %1 = opaque.f32 \"\xf4\x90\x80\x80\", %0 }",
                "line 3: opaque name \"\\xf4\\x90\\x80\\x80\" is not valid UTF-8: byte 0xf4 at "
                "offset 0 starts a code point above U+10FFFF"},
        BadText{"graph \xff", "line 1: expected the graph name in quotes, got byte 0xff"}));

}  // namespace
}  // namespace optfuse
