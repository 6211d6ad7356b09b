// XXH3-128 and the structural hash of a graph.
#include <xxhash.h>

#include <cstdio>

#include "optfuse/graph.h"

namespace optfuse {

std::string Hash128::hex() const {
  char buf[33];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(hi),
                static_cast<unsigned long long>(lo));
  return buf;
}

Hash128 xxh3_128(std::string_view bytes) {
  XXH128_hash_t h = XXH3_128bits(bytes.data(), bytes.size());
  return {h.high64, h.low64};
}

// The canonical text is the hashed form (not the in-memory nodes), so the hash changes exactly
// when the canonical text does; the name is blanked because it labels, not describes, the update.
Hash128 structural_hash(const Graph& g) {
  Graph canonical = canonicalize(g);
  canonical.set_name("");
  return xxh3_128(print(canonical));
}

}  // namespace optfuse
