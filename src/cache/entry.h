#pragma once
// The entry file format (cache/README.md): a magic line, one line of metadata JSON, the object.
// Decoding checks everything that can be checked without the caller; the caller then compares
// the key, kind and signature with what it expects.
#include <cstdint>
#include <string>
#include <vector>

#include "optfuse/engine.h"

namespace optfuse::cache {

inline constexpr const char* kMagic = "optfuse-cache-entry 1";
inline constexpr int kFormat = 1;

struct Metadata {
  std::string key, kind, name, target;
  std::string signature_xxh3;  // XXH3-128 of ObjectInfo::signature
  std::string optfuse_version, toolchain;
  uint64_t object_bytes = 0;
  std::string object_xxh3;  // XXH3-128 of the object bytes
  double created = 0;       // Unix seconds
};

Metadata make_metadata(const std::string& key, const ObjectInfo& info,
                       const std::vector<char>& object);
std::string hash_hex(const char* data, size_t size);

std::vector<char> encode(const Metadata& m, const std::vector<char>& object);

// Parses `bytes` as an entry: on success fills `*m` and `*object` (if non-null) and returns "";
// otherwise returns what is wrong ("truncated object: ...", "checksum mismatch", ...). Checks the
// magic, metadata syntax, versions (this build's optfuse, Halide and LLVM), size and checksum.
// Only the metadata is checked when `object` is null and `check_object` is false.
std::string decode(const std::vector<char>& bytes, Metadata* m, std::vector<char>* object,
                   bool check_object = true);

}  // namespace optfuse::cache
