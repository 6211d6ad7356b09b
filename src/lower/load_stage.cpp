#include "lower/load_stage.h"

#include <llvm/IR/Constants.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Instructions.h>
#include <llvm/IR/IntrinsicInst.h>
#include <llvm/IR/Module.h>

#include <vector>

namespace optfuse::lower {
namespace {

// The writes and reads of one buffer, or nothing when it has another use.
struct Uses {
  std::vector<llvm::Instruction*> writes;  // stores and masked stores into the buffer
  std::vector<llvm::LoadInst*> reads;
  bool only_these = true;
};

bool is_masked_store(const llvm::Instruction* i) {
  const auto* c = llvm::dyn_cast<llvm::IntrinsicInst>(i);
  return c && c->getIntrinsicID() == llvm::Intrinsic::masked_store;
}

Uses uses_of(llvm::AllocaInst* buffer) {
  Uses u;
  for (llvm::User* user : buffer->users()) {
    auto* i = llvm::dyn_cast<llvm::Instruction>(user);
    if (auto* load = llvm::dyn_cast_or_null<llvm::LoadInst>(i); load && !load->isVolatile()) {
      u.reads.push_back(load);
    } else if (auto* store = llvm::dyn_cast_or_null<llvm::StoreInst>(i);
               store && !store->isVolatile() && store->getPointerOperand() == buffer &&
               store->getValueOperand() != buffer) {
      u.writes.push_back(store);
    } else if (i && is_masked_store(i) && i->getOperand(1) == buffer &&
               i->getOperand(0) != buffer) {
      u.writes.push_back(i);
    } else {
      u.only_these = false;
    }
  }
  return u;
}

// The write whose value `read` sees: the last one before it in its block, or null when there is
// none (or it writes another type).
llvm::Instruction* write_before(llvm::LoadInst* read, llvm::AllocaInst* buffer) {
  for (llvm::Instruction* i = read->getPrevNode(); i; i = i->getPrevNode()) {
    const bool store = llvm::isa<llvm::StoreInst>(i) && i->getOperand(1) == buffer;
    if (store || (is_masked_store(i) && i->getOperand(1) == buffer))
      return i->getOperand(0)->getType() == read->getType() ? i : nullptr;
  }
  return nullptr;
}

// The value `write` left in the buffer: a store's, or a masked store's lanes and zeros.
llvm::Value* written(llvm::Instruction* write, llvm::LoadInst* read) {
  llvm::Value* value = write->getOperand(0);
  if (llvm::isa<llvm::StoreInst>(write)) return value;
  llvm::IRBuilder<> b(read);
  return b.CreateSelect(write->getOperand(3), value,
                        llvm::Constant::getNullValue(value->getType()));
}

// Halide names a Func's buffers after it: "load.08", or "load$2.08" in a function's second copy.
bool is_load_stage(llvm::StringRef name) {
  return name.consume_front("load") && (name.empty() || name.front() == '.' || name.front() == '$');
}

void forward(llvm::AllocaInst* buffer) {
  Uses u = uses_of(buffer);
  if (!u.only_these) return;
  std::vector<llvm::Instruction*> sources;
  for (llvm::LoadInst* read : u.reads) {
    sources.push_back(write_before(read, buffer));
    if (!sources.back()) return;
  }
  for (size_t i = 0; i < u.reads.size(); ++i) {
    u.reads[i]->replaceAllUsesWith(written(sources[i], u.reads[i]));
    u.reads[i]->eraseFromParent();
  }
  for (llvm::Instruction* w : u.writes) w->eraseFromParent();
  buffer->eraseFromParent();
}

}  // namespace

void finish_load_stage_pass(llvm::Module& m) {
  for (llvm::Function& f : m) {
    if (f.isDeclaration()) continue;
    std::vector<llvm::AllocaInst*> buffers;
    for (llvm::Instruction& i : f.getEntryBlock())
      if (auto* a = llvm::dyn_cast<llvm::AllocaInst>(&i); a && is_load_stage(a->getName()))
        buffers.push_back(a);
    for (llvm::AllocaInst* a : buffers) forward(a);
  }
}

}  // namespace optfuse::lower
