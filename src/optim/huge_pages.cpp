// advise_huge_pages (optfuse/optim.h): madvise(MADV_HUGEPAGE) where the OS has it; and whether
// the optimizer asks it for its new state (OPTFUSE_HUGE_PAGES=1).
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "optfuse/optim.h"

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace optfuse {

bool advise_huge_pages(void* data, size_t bytes) {
  constexpr uintptr_t kHuge = uintptr_t(2) << 20;
  const auto at = reinterpret_cast<uintptr_t>(data);
  const uintptr_t begin = (at + kHuge - 1) & ~(kHuge - 1), end = (at + bytes) & ~(kHuge - 1);
  if (end <= begin) return false;
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  return madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE) == 0;
#else
  return false;
#endif
}

bool huge_pages_for_new_state(size_t bytes) {
  if (bytes < (size_t(4) << 20)) return false;
  // Read at each call (once per new state buffer): a test or a launcher may set it after the
  // library loaded.
  const char* e = std::getenv("OPTFUSE_HUGE_PAGES");
  return e && std::strcmp(e, "1") == 0;
}

}  // namespace optfuse
