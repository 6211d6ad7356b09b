#include "lower/one_nan_test.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "lower/bf16.h"
#include "lower/fma.h"

namespace optfuse::lower {
namespace {

using namespace Halide::Internal;
using Halide::Expr;

// A store of reinterpret(kF32PairToBf16NanBranch(x's even half, x's odd half)) (even_odd.cpp).
struct PairStore {
  const Store* store;
  Expr x;  // the f32 vector in even/odd order
};

const Call* pair_call(const Store* s) {
  const Call* r = s->value.as<Call>();
  if (!r || !r->is_intrinsic(Call::reinterpret)) return nullptr;
  const Call* c = r->args[0].as<Call>();
  return c && c->name == kF32PairToBf16NanBranch ? c : nullptr;
}

// The pair stores in program order, every name the body binds with its value, the buffers it
// allocates and those it loads from after the first pair store.
class Collect : public IRVisitor {
 public:
  std::vector<PairStore> stores;
  std::map<std::string, Expr> bound;
  std::set<std::string> allocated, loaded_after_a_store;
  bool names_unique = true;

 private:
  using IRVisitor::visit;
  void bind(const std::string& name, const Expr& value) {
    names_unique = names_unique && bound.emplace(name, value).second;
  }
  void visit(const LetStmt* op) override {
    bind(op->name, op->value);
    IRVisitor::visit(op);
  }
  void visit(const Let* op) override {
    bind(op->name, op->value);
    IRVisitor::visit(op);
  }
  void visit(const Allocate* op) override {
    allocated.insert(op->name);
    IRVisitor::visit(op);
  }
  void visit(const Load* op) override {
    if (!stores.empty()) loaded_after_a_store.insert(op->name);
    IRVisitor::visit(op);
  }
  void visit(const Store* op) override {
    if (const Call* c = pair_call(op)) {
      const Shuffle* even = c->args[0].as<Shuffle>();
      if (even && even->vectors.size() == 1) stores.push_back({op, even->vectors[0]});
    }
    IRVisitor::visit(op);
  }
};

// An expression with the variables the body binds replaced by their values, throughout (Halide
// binds the same value to a new name per store: the value a store narrows is recomputed in
// another's under other names).
class Expanded : public IRMutator {
 public:
  explicit Expanded(const std::map<std::string, Expr>& bound) : bound_(bound) {}

 private:
  using IRMutator::visit;
  const std::map<std::string, Expr>& bound_;
  std::map<std::string, Expr> done_;
  Expr visit(const Variable* op) override {
    const auto def = bound_.find(op->name);
    if (def == bound_.end()) return op;
    const auto d = done_.find(op->name);
    if (d != done_.end()) return d->second;
    return done_[op->name] = mutate(def->second);
  }
};

// Whether a NaN in a lane of `from` is one in that lane of `to` (both expanded): `to` computes
// from `from` lane for lane through operations that return a NaN for a NaN operand.
class NanReaches {
 public:
  bool operator()(const Expr& to, const Expr& from) {
    if (to.type().lanes() != from.type().lanes() || !to.type().is_float()) return false;
    if (to.same_as(from) || graph_equal(to, from)) return true;
    const std::pair<const IRNode*, const IRNode*> key(to.get(), from.get());
    const auto seen = memo_.find(key);
    if (seen != memo_.end()) return seen->second;
    bool r = false;
    if (const Add* a = to.as<Add>()) {
      r = (*this)(a->a, from) || (*this)(a->b, from);
    } else if (const Sub* s = to.as<Sub>()) {
      r = (*this)(s->a, from) || (*this)(s->b, from);
    } else if (const Mul* m = to.as<Mul>()) {
      r = (*this)(m->a, from) || (*this)(m->b, from);
    } else if (const Div* d = to.as<Div>()) {
      r = (*this)(d->a, from) || (*this)(d->b, from);
    } else if (const Cast* c = to.as<Cast>()) {
      r = c->value.type().is_float() && (*this)(c->value, from);
    } else if (const Let* l = to.as<Let>()) {
      r = (*this)(l->body, from);
    } else if (const Select* sel = to.as<Select>()) {  // either way, or the way it always goes
      const bool a = (*this)(sel->true_value, from), b = (*this)(sel->false_value, from);
      r = (a && b) || (a && is_const_one(sel->condition)) || (b && is_const_zero(sel->condition));
    } else if (const Call* c = to.as<Call>()) {
      const bool propagates = c->is_intrinsic(Call::strict_float) || c->name == "sqrt_f32" ||
                              c->name == kSqrtF32 || c->name == kFmaF32;
      for (const Expr& a : c->args) r = r || (propagates && (*this)(a, from));
    }
    return memo_[key] = r;
  }

 private:
  std::map<std::pair<const IRNode*, const IRNode*>, bool> memo_;  // (DAGs: shared nodes)
};

// The number of pair stores in a statement.
int pair_stores_in(const Stmt& s) {
  class Count : public IRVisitor {
   public:
    int n = 0;

   private:
    using IRVisitor::visit;
    void visit(const Store* op) override { n += pair_call(op) != nullptr; }
  } count;
  s.accept(&count);
  return count.n;
}

// The variables a statement uses that it does not bind itself.
class FreeVariables : public IRVisitor {
 public:
  std::set<std::string> names;

 private:
  using IRVisitor::visit;
  Scope<> inner_;
  void visit(const Variable* op) override {
    if (!inner_.contains(op->name)) names.insert(op->name);
  }
  void visit(const Let* op) override {
    op->value.accept(this);
    ScopedBinding<> bind(inner_, op->name);
    op->body.accept(this);
  }
  void visit(const LetStmt* op) override {
    op->value.accept(this);
    ScopedBinding<> bind(inner_, op->name);
    op->body.accept(this);
  }
};

bool allocates(const Stmt& s) {
  class Finds : public IRVisitor {
   public:
    bool found = false;

   private:
    using IRVisitor::visit;
    void visit(const Allocate*) override { found = true; }
  } finds;
  s.accept(&finds);
  return finds.found;
}

// Each pair store narrowing without its NaN test (the second writes narrow by exact_pairs).
class Untested : public IRMutator {
  using IRMutator::visit;
  Expr visit(const Call* op) override {
    if (op->name != kF32PairToBf16NanBranch) return IRMutator::visit(op);
    return Call::make(op->type, kF32PairToBf16, op->args, Call::PureExtern);
  }
};

// reinterpret(`stored`, the words of x's even and odd halves' bf16), exactly (bf16_bits_of), as
// vector operations.
Expr exact_pairs(const Expr& x, Halide::Type stored) {
  const int half = x.type().lanes() / 2;
  const Halide::Type u32 = Halide::UInt(32, half);
  auto bf16 = [&](int first) {
    return Cast::make(u32, bf16_bits_of(Shuffle::make_slice(x, first, 1, half)));
  };
  return reinterpret(stored, (bf16(half) << 16) | bf16(0));
}

// `s` with each statement bound by a LetStmt followed by the rest of its block inside that
// LetStmt: {let a = v in s1; s2} becomes let a = v in {s1; s2}. The same values in the same
// order (the body's names are unique), and every name bound before a statement in scope there.
Stmt lets_lifted(const Stmt& s) {
  if (const LetStmt* l = s.as<LetStmt>())
    return LetStmt::make(l->name, l->value, lets_lifted(l->body));
  if (const ProducerConsumer* pc = s.as<ProducerConsumer>())
    return ProducerConsumer::make(pc->name, pc->is_producer, lets_lifted(pc->body));
  if (const Block* b = s.as<Block>()) {
    const Stmt first = lets_lifted(b->first);
    if (const LetStmt* l = first.as<LetStmt>())
      return LetStmt::make(l->name, l->value, lets_lifted(Block::make(l->body, b->rest)));
    return Block::make(first, lets_lifted(b->rest));
  }
  return s;
}

// `s` with `after` right after the store `last`.
class PlaceAfter : public IRMutator {
 public:
  PlaceAfter(const Store* last, Stmt after) : last_(last), after_(std::move(after)) {}
  bool placed = false;

 private:
  using IRMutator::visit;
  const Store* last_;
  Stmt after_;
  Stmt visit(const Store* op) override {
    if (op != last_) return op;
    placed = true;
    return Block::make(op, after_);
  }
};

// `s` with the allocations it frees freed at its end: the fix-up may read them after the last
// store (the load stage frees each buffer after its last reader).
Stmt frees_last(const Stmt& s) {
  class TakeFrees : public IRMutator {
   public:
    std::vector<Stmt> frees;

   private:
    using IRMutator::visit;
    Stmt visit(const Free* op) override {
      frees.push_back(op);
      return Evaluate::make(0);
    }
  } take;
  std::vector<Stmt> seq = {take.mutate(s)};
  seq.insert(seq.end(), take.frees.begin(), take.frees.end());
  return Block::make(seq);
}

// Each pair store's value bound to a name of its own just before the store, so that the test and
// the second writes use the value computed for the store (an expression again would be
// generated again, and merged by LLVM only after it compiled it twice).
class BindValues : public IRMutator {
  using IRMutator::visit;
  Stmt visit(const Store* op) override {
    const Call* c = pair_call(op);
    if (!c) return op;
    const Expr x = c->args[0].as<Shuffle>()->vectors[0];
    const int half = x.type().lanes() / 2;
    const std::string name = unique_name("pair_value");
    const Expr v = Variable::make(x.type(), name);
    const Expr call =
        Call::make(c->type, c->name,
                   {Shuffle::make_slice(v, 0, 1, half), Shuffle::make_slice(v, half, 1, half)},
                   Call::PureExtern);
    return LetStmt::make(name, x,
                         Store::make(op->name, reinterpret(op->value.type(), call), op->index,
                                     op->param, op->predicate, op->alignment));
  }
};

// The NaN tests of `s`'s pair stores made one (undefined where that saves none). `body`: what
// the loop body binds and allocates; `expand` substitutes what it binds.
Stmt one_test(const Stmt& s, const Collect& body, Expanded& expand) {
  const Stmt lifted = lets_lifted(frees_last(s));
  Collect c;
  lifted.accept(&c);
  // Between a store and the fix-up nothing may read what the store wrote: after the first store
  // `s` loads from the body's own stack buffers only (the load stage's, lower/load_stage.h).
  for (const std::string& b : c.loaded_after_a_store)
    if (!body.allocated.count(b)) return Stmt();
  std::vector<Expr> values;
  for (const PairStore& p : c.stores) values.push_back(expand.mutate(p.x));
  NanReaches reaches;
  // Sinks: the stores no other store's value covers (two that cover each other both are).
  std::vector<bool> sink(values.size(), true);
  for (size_t i = 0; i < values.size(); ++i)
    for (size_t j = 0; j < values.size(); ++j)
      if (j != i && reaches(values[j], values[i]) && !reaches(values[i], values[j]))
        sink[i] = false;
  if (std::find(sink.begin(), sink.end(), false) == sink.end()) return Stmt();
  const Stmt lifted_bound = lets_lifted(BindValues().mutate(lifted));
  Collect b;
  lifted_bound.accept(&b);
  Expr any_nan;
  for (size_t i = 0; i < values.size(); ++i) {
    if (!sink[i]) continue;
    const Expr& x = b.stores[i].x;
    const int half = x.type().lanes() / 2;
    Expr test = VectorReduce::make(
        VectorReduce::Or,
        Call::make(Halide::Bool(half), kUnordered,
                   {Shuffle::make_slice(x, 0, 1, half), Shuffle::make_slice(x, half, 1, half)},
                   Call::PureExtern),
        1);
    any_nan = any_nan.defined() ? (any_nan || test) : test;
  }
  // The fix-up: each store again, narrowed exactly by integer operations on whole vectors (no
  // call Halide would emit lane by lane: those cost compile time).
  std::vector<Stmt> exact;
  for (const PairStore& p : b.stores)
    exact.push_back(Store::make(p.store->name, exact_pairs(p.x, p.store->value.type()),
                                p.store->index, p.store->param, p.store->predicate,
                                p.store->alignment));
  const Stmt fixup = IfThenElse::make(any_nan, Block::make(exact));
  PlaceAfter place(b.stores.back().store, fixup);
  const Stmt placed = place.mutate(lifted_bound);
  if (!place.placed) return Stmt();
  // Every name `s` binds that the fix-up uses is bound where it is: lets_lifted put the last
  // store inside all the LetStmts before it; one bound after it, or in a branch, would not be.
  // (Names bound around `s` are: its stores used them.)
  class Bound : public IRVisitor {
   public:
    explicit Bound(const IRNode* target) : target_(target) {}
    std::set<std::string> in_scope;
    bool found = false;

   private:
    using IRVisitor::visit;
    const IRNode* target_;
    std::vector<std::string> stack_;
    void visit(const LetStmt* op) override {
      stack_.push_back(op->name);
      IRVisitor::visit(op);
      stack_.pop_back();
    }
    void visit(const IfThenElse* op) override {
      if (op == target_ && !found) {
        found = true;
        in_scope.insert(stack_.begin(), stack_.end());
      }
      IRVisitor::visit(op);
    }
  } bound(fixup.get());
  placed.accept(&bound);
  FreeVariables uses;
  fixup.accept(&uses);
  for (const std::string& n : uses.names)
    if (b.bound.count(n) && !bound.in_scope.count(n)) return Stmt();
  return Untested().mutate(placed);
}

// Each largest statement with two or more pair stores and no allocation given one test where
// one_test can, else its parts.
class OneTestPerGroup : public IRMutator {
 public:
  explicit OneTestPerGroup(const Collect& body) : body_(body), expand_(body.bound) {}
  using IRMutator::mutate;
  Stmt mutate(const Stmt& s) override {
    if (s.defined() && !allocates(s) && pair_stores_in(s) >= 2)
      if (Stmt t = one_test(s, body_, expand_); t.defined()) return t;
    return IRMutator::mutate(s);  // (or each part of it, where those have stores)
  }

 private:
  const Collect& body_;
  Expanded expand_;  // (one substitution of each name for all the groups)
};

}  // namespace

Stmt with_one_nan_test(const Stmt& body) {
  Collect c;
  body.accept(&c);
  if (!c.names_unique || c.stores.size() < 2) return body;
  return OneTestPerGroup(c).mutate(body);
}

}  // namespace optfuse::lower
