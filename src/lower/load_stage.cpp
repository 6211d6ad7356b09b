#include "lower/load_stage.h"

#include <llvm/IR/Constants.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Instructions.h>
#include <llvm/IR/IntrinsicInst.h>
#include <llvm/IR/Module.h>

#include <vector>

namespace optfuse::lower {
namespace {

// One load, store or masked store of a buffer: `size` bytes from byte `offset`.
struct Access {
  llvm::Instruction* inst;
  int64_t offset;
  uint64_t size;
  bool read;
};

bool is_masked_store(const llvm::Instruction* i) {
  const auto* c = llvm::dyn_cast<llvm::IntrinsicInst>(i);
  return c && c->getIntrinsicID() == llvm::Intrinsic::masked_store;
}

// The accesses of the buffer through `ptr` (the buffer, or a bitcast or constant-index GEP of
// it: Halide reads a [16 x float] buffer as two <8 x float> halves), and the casts on the way.
// False when the buffer has any other use.
bool collect(llvm::Value* ptr, int64_t offset, const llvm::DataLayout& dl,
             std::vector<Access>& accesses, std::vector<llvm::Instruction*>& casts) {
  for (llvm::User* user : ptr->users()) {
    auto* i = llvm::dyn_cast<llvm::Instruction>(user);
    if (!i) return false;
    if (auto* gep = llvm::dyn_cast<llvm::GetElementPtrInst>(i)) {
      llvm::APInt more(dl.getIndexTypeSizeInBits(gep->getType()), 0);
      if (gep->getPointerOperand() != ptr || !gep->accumulateConstantOffset(dl, more)) return false;
      casts.push_back(gep);
      if (!collect(gep, offset + more.getSExtValue(), dl, accesses, casts)) return false;
    } else if (llvm::isa<llvm::BitCastInst>(i)) {
      casts.push_back(i);
      if (!collect(i, offset, dl, accesses, casts)) return false;
    } else if (auto* load = llvm::dyn_cast<llvm::LoadInst>(i); load && !load->isVolatile()) {
      accesses.push_back({i, offset, dl.getTypeStoreSize(load->getType()), true});
    } else if (auto* store = llvm::dyn_cast<llvm::StoreInst>(i);
               store && !store->isVolatile() && store->getValueOperand() != ptr) {
      accesses.push_back(
          {i, offset, dl.getTypeStoreSize(store->getValueOperand()->getType()), false});
    } else if (is_masked_store(i) && i->getOperand(1) == ptr && i->getOperand(0) != ptr) {
      accesses.push_back({i, offset, dl.getTypeStoreSize(i->getOperand(0)->getType()), false});
    } else {
      return false;
    }
  }
  return true;
}

// Whether every two accesses that overlap cover the same bytes: the buffer is a set of slots,
// each read and written whole.
bool whole_slots(const std::vector<Access>& accesses) {
  for (const Access& a : accesses)
    for (const Access& b : accesses)
      if (a.offset < b.offset + int64_t(b.size) && b.offset < a.offset + int64_t(a.size) &&
          (a.offset != b.offset || a.size != b.size))
        return false;
  return true;
}

// The write whose value `read` sees: the last write of its slot before it in its block, or null
// when there is none (or it writes another type).
llvm::Instruction* write_before(const Access& read, const std::vector<Access>& accesses) {
  for (llvm::Instruction* i = read.inst->getPrevNode(); i; i = i->getPrevNode())
    for (const Access& w : accesses)
      if (w.inst == i && !w.read && w.offset == read.offset)
        return i->getOperand(0)->getType() == read.inst->getType() ? i : nullptr;
  return nullptr;
}

// The value `write` left in its slot: a store's, or a masked store's lanes and zeros.
llvm::Value* written(llvm::Instruction* write, llvm::Instruction* read) {
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

void forward(llvm::AllocaInst* buffer, const llvm::DataLayout& dl) {
  std::vector<Access> accesses;
  std::vector<llvm::Instruction*> casts;
  if (!collect(buffer, 0, dl, accesses, casts) || !whole_slots(accesses)) return;
  std::vector<std::pair<llvm::Instruction*, llvm::Instruction*>> reads;  // (read, its write)
  for (const Access& a : accesses) {
    if (!a.read) continue;
    reads.emplace_back(a.inst, write_before(a, accesses));
    if (!reads.back().second) return;
  }
  for (auto [read, write] : reads) read->replaceAllUsesWith(written(write, read));
  for (const Access& a : accesses) a.inst->eraseFromParent();
  for (auto it = casts.rbegin(); it != casts.rend(); ++it) (*it)->eraseFromParent();
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
    for (llvm::AllocaInst* a : buffers) forward(a, m.getDataLayout());
  }
}

}  // namespace optfuse::lower
