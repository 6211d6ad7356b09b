#include "jit/jit.h"

// LLVM 14's ORC headers trip GCC's -Wredundant-move; they are not ours to fix.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wredundant-move"
#include <llvm/ExecutionEngine/JITEventListener.h>
#include <llvm/ExecutionEngine/Orc/ExecutionUtils.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/ExecutionEngine/Orc/RTDyldObjectLinkingLayer.h>
#include <llvm/ExecutionEngine/SectionMemoryManager.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/TargetSelect.h>
#pragma GCC diagnostic pop

#include <cstdlib>
#include <cstring>
#include <mutex>

#include "jit/elf.h"
#include "optfuse/error.h"

namespace optfuse::jit {
namespace {

// llvm::Error -> optfuse::Error, consuming the llvm::Error.
[[noreturn]] void throw_llvm(const std::string& what, llvm::Error err) {
  throw Error(what + ": " + llvm::toString(std::move(err)));
}

template <typename T>
T unwrap(llvm::Expected<T> value, const std::string& what) {
  if (!value) throw_llvm(what, value.takeError());
  return std::move(*value);
}

void initialize_llvm_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
  });
}

// OPTFUSE_PERF_JITDUMP=1 (a debugging aid, off by default): LLVM's perf listener writes
// jit-<pid>.dump as kernels load, and `perf record -k 1` then `perf inject --jit` give perf the
// kernels' symbols (else their samples read "[JIT] tid"). The layer is LLJIT's own default on
// x86-64 Linux (RTDyld over a SectionMemoryManager), with the listener registered.
llvm::orc::LLJITBuilder jit_builder() {
  llvm::orc::LLJITBuilder builder;
  const char* dump = std::getenv("OPTFUSE_PERF_JITDUMP");
  if (!dump || !*dump || std::strcmp(dump, "0") == 0) return builder;
  builder.setObjectLinkingLayerCreator(
      [](llvm::orc::ExecutionSession& es,
         const llvm::Triple&) -> llvm::Expected<std::unique_ptr<llvm::orc::ObjectLayer>> {
        auto layer = std::make_unique<llvm::orc::RTDyldObjectLinkingLayer>(
            es, [] { return std::make_unique<llvm::SectionMemoryManager>(); });
        if (llvm::JITEventListener* perf = llvm::JITEventListener::createPerfJITEventListener())
          layer->registerJITEventListener(*perf);
        return std::unique_ptr<llvm::orc::ObjectLayer>(std::move(layer));
      });
  return builder;
}

}  // namespace

struct Jit::Impl {
  // What ORC reported while linking (e.g. "Symbols not found: [ f ]"): the lookup that ran into
  // it only says "Failed to materialize symbols". Kept for link()'s message; bounded. (Declared
  // before the JIT, whose error reporter writes here, so that they outlive it.)
  std::mutex reported_mutex;
  std::string reported;
  std::unique_ptr<llvm::orc::LLJIT> lljit;
};

Jit::Jit(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Jit::~Jit() = default;

std::unique_ptr<Jit> Jit::create() {
  initialize_llvm_once();
  auto impl = std::make_unique<Impl>();
  impl->lljit = unwrap(jit_builder().create(), "cannot create the LLVM JIT");
  // Every failure reaches the caller through the lookup that ran into it (an Error), with its
  // cause kept here; without this ORC would print each to stderr, e.g. for an object `cache
  // verify` finds broken.
  impl->lljit->getExecutionSession().setErrorReporter([raw = impl.get()](llvm::Error err) {
    std::string text = llvm::toString(std::move(err));
    std::lock_guard<std::mutex> lock(raw->reported_mutex);
    if (raw->reported.size() < 4096) raw->reported += (raw->reported.empty() ? "" : "; ") + text;
  });
  char prefix = impl->lljit->getDataLayout().getGlobalPrefix();
  impl->lljit->getMainJITDylib().addGenerator(
      unwrap(llvm::orc::DynamicLibrarySearchGenerator::GetForCurrentProcess(prefix),
             "cannot search the process for symbols"));
  return std::unique_ptr<Jit>(new Jit(std::move(impl)));
}

std::string Jit::object_problem(const std::vector<char>& object) {
  return elf_object_problem(object.data(), object.size(), host_elf_identity());
}

void Jit::add_object(const std::vector<char>& object, const std::string& name) {
  // ORC would link an object for another machine (an x86 process, AArch64 code) and the first
  // call into it would crash the process: whatever handed it over, it stops here.
  if (std::string why = object_problem(object); !why.empty())
    throw Error("cannot load object " + name + ": " + why);
  auto buffer =
      llvm::MemoryBuffer::getMemBufferCopy(llvm::StringRef(object.data(), object.size()), name);
  if (llvm::Error err = impl_->lljit->addObjectFile(std::move(buffer)))
    throw_llvm("cannot load object " + name, std::move(err));
}

void* Jit::link(const std::vector<char>& object, const std::string& name, const std::string& symbol,
                bool keep) {
  if (std::string why = object_problem(object); !why.empty())
    throw LinkError("cannot load object " + name + ": " + why);
  // The object's own tracker: removing it takes its symbols and code out of the JIT again, so a
  // failed link leaves nothing behind (no half-defined symbols another object would clash with).
  llvm::orc::ResourceTrackerSP tracker = impl_->lljit->getMainJITDylib().createResourceTracker();
  auto remove = [&] { llvm::consumeError(tracker->remove()); };
  auto buffer =
      llvm::MemoryBuffer::getMemBufferCopy(llvm::StringRef(object.data(), object.size()), name);
  if (llvm::Error err = impl_->lljit->addObjectFile(tracker, std::move(buffer))) {
    std::string why = llvm::toString(std::move(err));
    remove();
    throw LinkError("cannot load object " + name + ": " + why);
  }
  {
    std::lock_guard<std::mutex> lock(impl_->reported_mutex);
    impl_->reported.clear();
  }
  llvm::Expected<llvm::JITEvaluatedSymbol> sym = impl_->lljit->lookup(symbol);
  if (!sym) {
    std::string why = llvm::toString(sym.takeError());
    remove();
    std::lock_guard<std::mutex> lock(impl_->reported_mutex);
    throw LinkError("cannot link object " + name + ": " +
                    (impl_->reported.empty() ? why : impl_->reported));
  }
  if (!keep) remove();
  return reinterpret_cast<void*>(static_cast<uintptr_t>(sym->getAddress()));
}

void* Jit::lookup(const std::string& symbol) {
  llvm::JITEvaluatedSymbol sym =
      unwrap(impl_->lljit->lookup(symbol), "cannot find symbol " + symbol);
  return reinterpret_cast<void*>(static_cast<uintptr_t>(sym.getAddress()));
}

}  // namespace optfuse::jit
