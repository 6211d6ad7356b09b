#pragma once
// The ObjectLinker (include/optfuse/cache.h) `optfuse cache verify` links entries with: each in
// a JIT of its own target's runtime, thrown away afterwards; nothing of them runs.
#include <memory>

#include "optfuse/cache.h"

namespace optfuse::engine_detail {

std::unique_ptr<ObjectLinker> make_object_linker();

}  // namespace optfuse::engine_detail
