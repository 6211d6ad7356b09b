// The textual form of a Graph (see graph.h): print() and a small recursive-descent parse().
#include <cctype>
#include <charconv>
#include <cmath>
#include <string>
#include <unordered_map>

#include "graph/names.h"
#include "optfuse/error.h"
#include "optfuse/graph.h"

namespace optfuse {
namespace {

// Names are written as quote_name (graph/names.h) escapes them: any name survives a round trip.
std::string quote(const std::string& s) { return quote_name(s); }

// "%.17g" (enough digits for any double to round-trip) via to_chars: printf would follow the
// C locale's decimal point, and the text is hashed, so it must not depend on the process locale.
std::string format_number(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::general, 17);
  return std::string(buf, res.ptr);
}

std::string op_word(const Node& n) {
  std::string_view op = n.op == Op::Input ? role_name(n.role) : op_name(n.op);
  return std::string(op) + "." + std::string(dtype_name(n.dtype));
}

std::string operands(const Node& n) {
  if (n.op == Op::Input || n.op == Op::Scalar) return quote(n.name);
  if (n.op == Op::Const) return format_number(n.value);
  if (n.op == Op::Opaque) return quote(n.name) + ", %" + std::to_string(n.args.at(0));
  std::string out;
  for (NodeId a : n.args) out += (out.empty() ? "%" : ", %") + std::to_string(a);
  return out;
}

enum class Tok { Word, String, Ref, Punct, End };

struct Token {
  Tok kind;
  std::string text;  // Word: the word; String: unescaped contents; Ref: digits; Punct: the char
  int line;
};

// Splits the text into tokens; whitespace and '#' comments separate tokens and are dropped.
class Lexer {
 public:
  explicit Lexer(std::string_view s) : s_(s) {}

  Token next() {
    skip_blanks_and_comments();
    if (pos_ >= s_.size()) return {Tok::End, "end of input", line_};
    char c = s_[pos_];
    if (c == '"') return string_token();
    if (c == '%') {
      ++pos_;
      std::string digits =
          take_while([](char ch) { return std::isdigit(static_cast<unsigned char>(ch)) != 0; });
      if (digits.empty()) fail("expected digits after '%'");
      return {Tok::Ref, digits, line_};
    }
    if (is_word_char(c)) return {Tok::Word, take_while(is_word_char), line_};
    ++pos_;
    return {Tok::Punct, std::string(1, c), line_};
  }

 private:
  static bool is_word_char(char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-' ||
           c == '+';
  }

  void skip_blanks_and_comments() {
    while (pos_ < s_.size()) {
      char c = s_[pos_];
      if (c == '#') {
        while (pos_ < s_.size() && s_[pos_] != '\n') ++pos_;
      } else if (std::isspace(static_cast<unsigned char>(c))) {
        line_ += c == '\n';
        ++pos_;
      } else {
        return;
      }
    }
  }

  template <typename Pred>
  std::string take_while(Pred pred) {
    size_t start = pos_;
    while (pos_ < s_.size() && pred(s_[pos_])) ++pos_;
    return std::string(s_.substr(start, pos_ - start));
  }

  Token string_token() {
    std::string out;
    for (++pos_; pos_ < s_.size() && s_[pos_] != '"'; ++pos_) {
      if (s_[pos_] == '\n') break;
      if (s_[pos_] != '\\') {
        out += s_[pos_];
        continue;
      }
      out += escaped_char();
    }
    if (pos_ >= s_.size() || s_[pos_] != '"') fail("unterminated string");
    ++pos_;
    return {Tok::String, out, line_};
  }

  // At a backslash: returns the character it stands for and leaves pos_ on its last character.
  char escaped_char() {
    char c = ++pos_ < s_.size() ? s_[pos_] : '\0';
    if (c == '"' || c == '\\') return c;
    unsigned value = 0;
    bool ok = c == 'x' && pos_ + 2 < s_.size();
    if (ok) {
      const char* hex = s_.data() + pos_ + 1;
      ok = std::from_chars(hex, hex + 2, value, 16).ptr == hex + 2;
    }
    if (!ok) fail("bad escape in string (expected \\\", \\\\ or \\xHH)");
    pos_ += 2;
    return static_cast<char>(value);
  }

  [[noreturn]] void fail(const std::string& what) const {
    throw Error("line " + std::to_string(line_) + ": " + what);
  }

  std::string_view s_;
  size_t pos_ = 0;
  int line_ = 1;
};

class Parser {
 public:
  explicit Parser(std::string_view text) : lex_(text) { advance(); }

  Graph parse_graph() {
    expect_word("graph");
    Token name = expect(Tok::String, "the graph name in quotes");
    at_line(name.line, [&] { g_.set_name(name.text); });
    expect_punct("{");
    while (!(tok_.kind == Tok::Punct && tok_.text == "}")) statement();
    advance();
    if (tok_.kind != Tok::End) fail("expected end of input after '}'");
    return std::move(g_);
  }

 private:
  void statement() {
    if (tok_.kind == Tok::Word && tok_.text == "out") return output();
    if (tok_.kind == Tok::Word && tok_.text == "result") return result();
    if (tok_.kind != Tok::Ref)
      fail("expected '%N = ...', 'out \"name\" = %N', 'result \"name\" = %N' or '}'");
    Token def = advance();
    if (ids_.count(def.text)) fail_at(def.line, "%" + def.text + " is already defined");
    expect_punct("=");
    ids_[def.text] = definition();
  }

  void output() {
    int line = advance().line;
    std::string name = expect(Tok::String, "the replaced input's name in quotes").text;
    expect_punct("=");
    NodeId value = reference();
    at_line(line, [&] { g_.output(name, g_.value(value)); });
  }

  void result() {
    int line = advance().line;
    std::string name = expect(Tok::String, "the result's name in quotes").text;
    expect_punct("=");
    NodeId value = reference();
    at_line(line, [&] { g_.result(name, g_.value(value)); });
  }

  // `op.dtype operands`; returns the node's id.
  NodeId definition() {
    Token word = expect(Tok::Word, "'op.dtype'");
    size_t dot = word.text.rfind('.');
    DType dtype;
    if (dot == std::string::npos || !parse_dtype(word.text.substr(dot + 1), &dtype))
      fail_at(word.line, "expected 'op.dtype' with dtype f32, f64, f16, bf16 or bool, got '" +
                             word.text + "'");
    const std::string op_text = word.text.substr(0, dot);
    NodeId id = -1;
    at_line(word.line, [&] { id = build(op_text, dtype, word.line); });
    return id;
  }

  NodeId build(const std::string& op_text, DType dtype, int line) {
    Role role;
    if (parse_role(op_text, &role)) return g_.input(role, name_operand(), dtype).id();
    Op op;
    if (!parse_op(op_text, &op) || op == Op::Input)
      fail_at(line, "unknown op '" + op_text +
                        "' (inputs are written param, grad, state, row_state or col_state)");
    if (op == Op::Scalar) return g_.scalar(name_operand(), dtype).id();
    if (op == Op::Const) return g_.constant(number(), dtype).id();
    Node n{op, dtype, false, {}, 0, "", Role::Param};
    if (op == Op::Opaque) {
      n.name = name_operand();
      expect_punct(",");
    }
    for (int i = 0; i < op_arity(op); ++i) {
      if (i > 0) expect_punct(",");
      n.args.push_back(reference());
    }
    return g_.add_node(std::move(n));
  }

  static bool parse_role(const std::string& s, Role* out) {
    for (Role r : {Role::Param, Role::Grad, Role::State, Role::RowState, Role::ColState}) {
      if (role_name(r) == s) {
        *out = r;
        return true;
      }
    }
    return false;
  }

  std::string name_operand() { return expect(Tok::String, "a name in quotes").text; }

  double number() {
    Token t = expect(Tok::Word, "a number");
    if (t.text == "nan") return NAN;
    if (t.text == "inf" || t.text == "-inf") return t.text[0] == '-' ? -HUGE_VAL : HUGE_VAL;
    double v = 0;
    auto res = std::from_chars(t.text.data(), t.text.data() + t.text.size(), v);
    if (res.ec == std::errc::result_out_of_range)
      fail_at(t.line, "the number '" + t.text + "' is out of range for a double");
    if (res.ec != std::errc() || res.ptr != t.text.data() + t.text.size())
      fail_at(t.line, "expected a number, got '" + t.text + "'");
    return v;
  }

  NodeId reference() {
    Token t = expect(Tok::Ref, "a reference '%N'");
    auto it = ids_.find(t.text);
    if (it == ids_.end()) fail_at(t.line, "%" + t.text + " is used before it is defined");
    return it->second;
  }

  Token advance() {
    Token prev = std::move(tok_);
    tok_ = lex_.next();
    return prev;
  }

  Token expect(Tok kind, const std::string& what) {
    if (tok_.kind != kind) fail("expected " + what);
    return advance();
  }
  void expect_word(const std::string& w) {
    if (tok_.kind != Tok::Word || tok_.text != w) fail("expected '" + w + "'");
    advance();
  }
  void expect_punct(const std::string& p) {
    if (tok_.kind != Tok::Punct || tok_.text != p) fail("expected '" + p + "'");
    advance();
  }

  // Runs a graph-building step, prefixing any Error it throws with the statement's line.
  template <typename F>
  void at_line(int line, F&& f) {
    try {
      f();
    } catch (const Error& e) {
      const std::string what = e.what();
      if (what.rfind("line ", 0) == 0) throw;
      fail_at(line, what);
    }
  }

  [[noreturn]] void fail(const std::string& what) const {
    fail_at(tok_.line, what + ", got " + describe(tok_));
  }
  [[noreturn]] static void fail_at(int line, const std::string& what) {
    throw Error("line " + std::to_string(line) + ": " + what);
  }
  static std::string describe(const Token& t) {
    switch (t.kind) {
      case Tok::String:
        return quote(t.text);
      case Tok::Ref:
        return "'%" + t.text + "'";
      case Tok::End:
        return t.text;
      case Tok::Punct:
        // A stray byte that is not printable ASCII is shown as hex, so messages stay UTF-8.
        if (const auto c = static_cast<unsigned char>(t.text[0]); c < 0x20 || c >= 0x7f) {
          static const char kHex[] = "0123456789abcdef";
          return std::string("byte 0x") + kHex[c >> 4] + kHex[c & 15];
        }
        break;
      case Tok::Word:
        break;
    }
    return "'" + t.text + "'";
  }

  Lexer lex_;
  Token tok_{Tok::End, "", 1};
  Graph g_;
  std::unordered_map<std::string, NodeId> ids_;  // "%N" in the text -> node id
};

}  // namespace

std::string print(const Graph& g) {
  std::string out = "graph " + quote(g.name()) + " {\n";
  for (size_t i = 0; i < g.nodes().size(); ++i) {
    const Node& n = g.nodes()[i];
    out += "  %" + std::to_string(i) + " = " + op_word(n) + " " + operands(n) + "\n";
  }
  for (const Output& o : g.outputs())
    out += "  out " + quote(o.replaces) + " = %" + std::to_string(o.value) + "\n";
  for (const Result& r : g.results())
    out += "  result " + quote(r.name) + " = %" + std::to_string(r.value) + "\n";
  return out + "}\n";
}

Graph parse(std::string_view text) { return Parser(text).parse_graph(); }

}  // namespace optfuse
