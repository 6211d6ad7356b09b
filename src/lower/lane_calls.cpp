#include "lower/lane_calls.h"

#include <llvm/IR/Constants.h>
#include <llvm/IR/Function.h>
#include <llvm/IR/Instructions.h>
#include <llvm/IR/Module.h>

#include <map>
#include <set>
#include <vector>

namespace optfuse::lower {
namespace {

// Where an instruction computing from `v` can go so that `v` dominates it: right after v's
// definition (after the phis of its block for a phi), or at the function's entry.
llvm::Instruction* just_after(llvm::Value* v, llvm::Function& f) {
  if (auto* phi = llvm::dyn_cast<llvm::PHINode>(v)) return phi->getParent()->getFirstNonPHI();
  if (auto* i = llvm::dyn_cast<llvm::Instruction>(v)) return i->getNextNode();
  return &*f.getEntryBlock().getFirstInsertionPt();
}

// The vector a call is one lane of, as Halide builds it: a chain of insertelements, one per
// lane, each of a call of `fn`, into an undefined vector. `last` is the chain's last insert.
struct Chain {
  llvm::InsertElementInst* last = nullptr;
  std::vector<llvm::CallInst*> lanes;  // by lane
};

bool chain_of(llvm::CallInst* call, llvm::Function* fn, Chain* chain) {
  if (!call->hasOneUse()) return false;
  auto* insert = llvm::dyn_cast<llvm::InsertElementInst>(*call->user_begin());
  if (!insert || insert->getOperand(1) != call) return false;
  while (insert->hasOneUse()) {
    auto* next = llvm::dyn_cast<llvm::InsertElementInst>(*insert->user_begin());
    if (!next || next->getOperand(0) != insert) break;
    insert = next;
  }
  chain->last = insert;
  chain->lanes.assign(llvm::cast<llvm::FixedVectorType>(insert->getType())->getNumElements(),
                      nullptr);
  llvm::Value* v = insert;
  while (auto* x = llvm::dyn_cast<llvm::InsertElementInst>(v)) {
    auto* index = llvm::dyn_cast<llvm::ConstantInt>(x->getOperand(2));
    auto* lane = llvm::dyn_cast<llvm::CallInst>(x->getOperand(1));
    if ((x != chain->last && !x->hasOneUse()) || !index || !lane ||
        lane->getCalledFunction() != fn || !lane->hasOneUse() ||
        index->getZExtValue() >= chain->lanes.size() || chain->lanes[index->getZExtValue()])
      return false;
    chain->lanes[index->getZExtValue()] = lane;
    v = x->getOperand(0);
  }
  if (!llvm::isa<llvm::UndefValue>(v)) return false;
  for (llvm::CallInst* c : chain->lanes)
    if (!c) return false;
  return true;
}

// The chain's calls' arguments, argument by argument, each gathered into a vector at b.
std::vector<llvm::Value*> gathered_arguments(llvm::IRBuilder<>& b, const Chain& chain) {
  std::vector<llvm::Value*> args;
  const unsigned lanes = static_cast<unsigned>(chain.lanes.size());
  for (unsigned a = 0; a < chain.lanes[0]->arg_size(); ++a) {
    llvm::Value* v = llvm::UndefValue::get(
        llvm::FixedVectorType::get(chain.lanes[0]->getArgOperand(a)->getType(), lanes));
    for (unsigned i = 0; i < lanes; ++i)
      v = b.CreateInsertElement(v, chain.lanes[i]->getArgOperand(a), b.getInt64(i));
    args.push_back(v);
  }
  return args;
}

// Replaces the chain's vector by `converted` and erases the chain and its calls.
void replace_chain(const Chain& chain, llvm::Value* converted, std::set<llvm::CallInst*>* erased) {
  chain.last->replaceAllUsesWith(converted);
  for (llvm::Value* v = chain.last; auto* x = llvm::dyn_cast<llvm::InsertElementInst>(v);) {
    v = x->getOperand(0);
    x->eraseFromParent();
  }
  for (llvm::CallInst* c : chain.lanes) {
    erased->insert(c);
    c->eraseFromParent();
  }
}

std::vector<llvm::CallInst*> calls_of(llvm::Function* fn) {
  std::vector<llvm::CallInst*> calls;
  for (llvm::User* u : fn->users())
    if (auto* call = llvm::dyn_cast<llvm::CallInst>(u)) calls.push_back(call);
  return calls;
}

}  // namespace

void replace_unary_lane_calls(llvm::Module& m, const char* name, const UnaryLanes& convert) {
  llvm::Function* fn = m.getFunction(name);
  if (!fn) return;
  std::map<llvm::Value*, llvm::Value*> whole;  // source vector -> its converted vector
  std::set<llvm::CallInst*> erased;
  for (llvm::CallInst* call : calls_of(fn)) {
    if (erased.count(call)) continue;
    llvm::Value* arg = call->getArgOperand(0);
    llvm::Value* result;
    auto* lane = llvm::dyn_cast<llvm::ExtractElementInst>(arg);
    Chain chain;
    if (chain_of(call, fn, &chain)) {
      // The whole vector Halide built lane by lane: its lanes' arguments gathered into one
      // vector again (LLVM may have split the source into halves, or scalarized an extract
      // of a loaded vector into a scalar load; the code generator folds the gathering back),
      // converted once, in place of the chain's vector.
      llvm::IRBuilder<> b(chain.last);
      replace_chain(chain, convert(b, gathered_arguments(b, chain)[0]), &erased);
      continue;
    } else if (lane && llvm::isa<llvm::ConstantInt>(lane->getIndexOperand())) {
      llvm::Value* source = lane->getVectorOperand();
      llvm::Value*& converted = whole[source];
      if (!converted) {
        llvm::IRBuilder<> b(just_after(source, *call->getFunction()));
        converted = convert(b, source);
      }
      llvm::IRBuilder<> b(call);
      result = b.CreateExtractElement(converted, lane->getIndexOperand());
    } else {
      llvm::IRBuilder<> b(call);
      result = convert(b, arg);
    }
    call->replaceAllUsesWith(result);
    call->eraseFromParent();
  }
  if (fn->use_empty()) fn->eraseFromParent();
}

void replace_lane_calls(llvm::Module& m, const char* name, const LaneCalls& convert) {
  llvm::Function* fn = m.getFunction(name);
  if (!fn) return;
  std::set<llvm::CallInst*> erased;
  for (llvm::CallInst* call : calls_of(fn)) {
    if (erased.count(call)) continue;
    Chain chain;
    if (chain_of(call, fn, &chain)) {
      llvm::IRBuilder<> b(chain.last);
      replace_chain(chain, convert(b, gathered_arguments(b, chain)), &erased);
      continue;
    }
    llvm::IRBuilder<> b(call);
    call->replaceAllUsesWith(
        convert(b, std::vector<llvm::Value*>(call->arg_begin(), call->arg_end())));
    call->eraseFromParent();
  }
  if (fn->use_empty()) fn->eraseFromParent();
}

}  // namespace optfuse::lower
