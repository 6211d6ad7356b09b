#include "lower/even_odd.h"

#include <vector>

#include "lower/bf16.h"
#include "lower/one_nan_test.h"

namespace optfuse::lower {
namespace {

using namespace Halide::Internal;
using Halide::Expr;

// The lane order of a vector value in a loop the pass rewrites.
enum class Order {
  Uniform,  // the same in every lane: scalars, broadcasts
  Memory,   // lane i is element i: loads, lane indices
  EvenOdd,  // the even elements, then the odd ones: bf16 vectors widened by the pass
  Mixed,    // values of both orders meet: the loop is left as it is
};

Order join(Order a, Order b) {
  if (a == Order::Uniform) return b;
  if (b == Order::Uniform || a == b) return a;
  return Order::Mixed;
}

bool is_bf16_widening(const Cast* op) {
  return op->value.type().is_bfloat() && !op->type.is_bfloat() && op->type.lanes() > 1;
}

// A widening the pass takes: 2k lanes, k of them words a target's vectors hold whole.
bool even_odd_lanes_fit(int lanes) { return lanes >= 8 && lanes % 8 == 0; }

// The order of an expression: the join of its leaves' orders, since every other node is
// element-wise. `vars`: the orders of the vector variables in scope (any other is Memory).
class OrderOf : public IRVisitor {
 public:
  explicit OrderOf(Scope<Order>& vars) : vars_(vars) {}
  Order result = Order::Uniform;

 private:
  using IRVisitor::visit;
  Scope<Order>& vars_;

  void add(Order o) { result = join(result, o); }
  Order of(const Expr& e) {
    OrderOf sub(vars_);
    e.accept(&sub);
    return sub.result;
  }

  // A vector load is in the order of its addresses: memory order for dense and uniform ones,
  // even/odd for a gather at indices computed from widened values.
  void visit(const Load* op) override {
    if (op->type.lanes() == 1) return;
    const Order at = join(of(op->index), of(op->predicate));
    add(at == Order::Uniform ? Order::Memory : at);
  }
  void visit(const Ramp*) override { add(Order::Memory); }
  void visit(const Broadcast* op) override {  // a scalar in every lane; a vector repeated is not
    if (op->value.type().lanes() > 1) add(Order::Mixed);
  }
  void visit(const Variable* op) override {
    if (op->type.lanes() == 1) return;
    add(vars_.contains(op->name) ? vars_.get(op->name) : Order::Memory);
  }
  void visit(const Cast* op) override {
    const Order value = of(op->value);
    const bool widened_here = is_bf16_widening(op) && value == Order::Memory;
    if (widened_here && !even_odd_lanes_fit(op->type.lanes())) return add(Order::Mixed);
    add(widened_here ? Order::EvenOdd : value);
  }
  void visit(const Shuffle* op) override {
    // One lane of a vector in memory order is a scalar; any other shuffle moves lanes.
    Order source = Order::Uniform;
    for (const Expr& v : op->vectors) source = join(source, of(v));
    if (op->type.lanes() > 1 || source == Order::EvenOdd) add(Order::Mixed);
  }
  void visit(const VectorReduce*) override { add(Order::Mixed); }
  void visit(const Call* op) override {
    const bool element_wise =
        op->call_type == Call::PureExtern || op->call_type == Call::PureIntrinsic;
    bool vector_args = op->type.lanes() > 1;
    for (const Expr& a : op->args) vector_args = vector_args || a.type().lanes() > 1;
    if (!vector_args) return;
    // A reinterpret that changes the lane count moves bits across lanes; a dynamic shuffle, lanes.
    bool lane_count_kept = true;
    for (const Expr& a : op->args)
      lane_count_kept =
          lane_count_kept && (a.type().lanes() == 1 || a.type().lanes() == op->type.lanes());
    if (!element_wise || !lane_count_kept || op->is_intrinsic(Call::dynamic_shuffle))
      return add(Order::Mixed);
    IRVisitor::visit(op);
  }
  void visit(const Let* op) override {
    const Order value = of(op->value);
    ScopedBinding<Order> bind(op->value.type().lanes() > 1, vars_, op->name, value);
    op->body.accept(this);
  }
};

Order order_of(const Expr& e, Scope<Order>& vars) {
  OrderOf o(vars);
  e.accept(&o);
  return o.result;
}

// Whether a loop body can run in even/odd order: no value Mixed, every EvenOdd value stored is a
// narrowing to bf16, no EvenOdd value used as an address, and at least one widening to gain by.
class Qualifies : public IRVisitor {
 public:
  explicit Qualifies(const Scope<Order>& outer) { vars_.set_containing_scope(&outer); }
  bool ok = true;
  bool widens = false;

 private:
  using IRVisitor::visit;
  Scope<Order> vars_;

  Order check(const Expr& e) {
    const Order o = order_of(e, vars_);
    ok = ok && o != Order::Mixed;
    widens = widens || o == Order::EvenOdd;
    return o;
  }
  // An address, condition or size: lane j must mean element j there.
  void in_memory_order(const Expr& e) {
    if (e.defined() && check(e) == Order::EvenOdd) ok = false;
  }

  void visit(const LetStmt* op) override {
    const Order value = check(op->value);
    ScopedBinding<Order> bind(op->value.type().lanes() > 1, vars_, op->name, value);
    op->body.accept(this);
  }
  void visit(const Store* op) override {
    in_memory_order(op->index);
    in_memory_order(op->predicate);
    if (check(op->value) != Order::EvenOdd) return;
    // (Its lane count is a widening's, which OrderOf checked.)
    const Cast* narrowing = op->value.as<Cast>();
    ok = ok && narrowing && narrowing->type.is_bfloat();
  }
  void visit(const IfThenElse* op) override {
    in_memory_order(op->condition);
    op->then_case.accept(this);
    if (op->else_case.defined()) op->else_case.accept(this);
  }
  void visit(const Evaluate* op) override { in_memory_order(op->value); }
  void visit(const AssertStmt* op) override {
    in_memory_order(op->condition);
    in_memory_order(op->message);
  }
  void visit(const Allocate* op) override {
    for (const Expr& e : op->extents) in_memory_order(e);
    in_memory_order(op->condition);
    in_memory_order(op->new_expr);
    op->body.accept(this);
  }
  void visit(const Provide*) override { ok = false; }  // not seen after lowering
  void visit(const For*) override { ok = false; }      // innermost loops only
};

// The rewrite of a qualifying loop body.
class Rewrite : public IRMutator {
 public:
  explicit Rewrite(const Scope<Order>& outer) { vars_.set_containing_scope(&outer); }

 private:
  using IRMutator::visit;
  Scope<Order> vars_;

  Expr visit(const Let* op) override {
    ScopedBinding<Order> bind(op->value.type().lanes() > 1, vars_, op->name,
                              order_of(op->value, vars_));
    return IRMutator::visit(op);
  }
  Stmt visit(const LetStmt* op) override {
    ScopedBinding<Order> bind(op->value.type().lanes() > 1, vars_, op->name,
                              order_of(op->value, vars_));
    return IRMutator::visit(op);
  }

  // A bf16 vector in memory order widened as its even elements, then its odd ones.
  Expr visit(const Cast* op) override {
    if (!is_bf16_widening(op) || order_of(op->value, vars_) != Order::Memory)
      return IRMutator::visit(op);
    const int half = op->type.lanes() / 2;
    const Halide::Type words = Halide::UInt(32, half), f32 = Halide::Float(32, half);
    Expr w = reinterpret(words, reinterpret(Halide::UInt(16, 2 * half), mutate(op->value)));
    Expr even = reinterpret(f32, w << 16);
    Expr odd = reinterpret(f32, w & make_const(words, 0xffff0000u));
    Expr value = Shuffle::make_concat({even, odd});
    return op->type == value.type() ? value : Cast::make(op->type, value);
  }

  // A narrowing stored: word j of the stored vector holds even lane j in its low half and odd
  // lane j in its high half.
  Stmt visit(const Store* op) override {
    const Cast* narrowing = op->value.as<Cast>();
    if (!narrowing || order_of(op->value, vars_) != Order::EvenOdd) return IRMutator::visit(op);
    const int lanes = narrowing->type.lanes();
    Expr x = mutate(narrowing->value);
    if (x.type() != Halide::Float(32, lanes)) x = Cast::make(Halide::Float(32, lanes), x);
    const Expr bits = Call::make(
        Halide::UInt(32, lanes / 2), kF32PairToBf16NanBranch,
        {Shuffle::make_slice(x, 0, 1, lanes / 2), Shuffle::make_slice(x, lanes / 2, 1, lanes / 2)},
        Call::PureExtern);
    return Store::make(op->name, reinterpret(narrowing->type, bits), mutate(op->index), op->param,
                       mutate(op->predicate), op->alignment);
  }
};

class ContainsLoop : public IRVisitor {
 public:
  bool found = false;

 private:
  using IRVisitor::visit;
  void visit(const For*) override { found = true; }
};

// Finds the innermost loops. Vector variables bound outside them keep memory order (nothing
// there is rewritten), unless uniform.
class InnermostLoops : public IRMutator {
 private:
  using IRMutator::visit;
  Scope<Order> vars_;

  Order outside(const Expr& e) {
    return order_of(e, vars_) == Order::Uniform ? Order::Uniform : Order::Memory;
  }
  Expr visit(const Let* op) override {
    ScopedBinding<Order> bind(op->value.type().lanes() > 1, vars_, op->name, outside(op->value));
    return IRMutator::visit(op);
  }
  Stmt visit(const LetStmt* op) override {
    ScopedBinding<Order> bind(op->value.type().lanes() > 1, vars_, op->name, outside(op->value));
    return IRMutator::visit(op);
  }
  Stmt visit(const For* op) override {
    ContainsLoop inner;
    op->body.accept(&inner);
    if (inner.found) return IRMutator::visit(op);
    Qualifies q(vars_);
    op->body.accept(&q);
    if (!q.ok || !q.widens) return op;
    const Stmt body = with_one_nan_test(Rewrite(vars_).mutate(op->body));
    return For::make(op->name, op->min, op->extent, op->for_type, op->device_api, body);
  }
};

}  // namespace

Stmt even_odd_lanes(const Stmt& s) { return InnermostLoops().mutate(s); }

}  // namespace optfuse::lower
