// advise_huge_pages (optfuse/optim.h): madvise(MADV_HUGEPAGE) where the OS has it.
#include <cstdint>

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

}  // namespace optfuse
