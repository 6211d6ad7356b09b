#pragma once
// The entry file format (cache/README.md): a magic line, one line of metadata JSON, a checksum
// line, the object. Decoding checks everything that can be checked without the caller; the
// caller then compares the key, kind, target and signature with what it expects.
#include <cstdint>
#include <string>
#include <vector>

#include "optfuse/cache.h"
#include "optfuse/object_store.h"

namespace optfuse::cache {

inline constexpr const char* kMagic = "optfuse-cache-entry 2";
inline constexpr const char* kMagicPrefix = "optfuse-cache-entry ";  // of every format's magic
inline constexpr int kFormat = 2;

struct Metadata {
  std::string key, kind, name, target;
  std::string signature_xxh3;  // XXH3-128 of ObjectInfo::signature
  std::string optfuse_version, toolchain;
  uint64_t object_bytes = 0;
  std::string object_xxh3;  // XXH3-128 of the object bytes
  double created = 0;       // Unix seconds
};

Metadata make_metadata(const std::string& key, const ObjectInfo& info,
                       const std::vector<char>& object, const std::string& toolchain);
std::string hash_hex(const char* data, size_t size);

// The entry's bytes; its checksum line is computed here, over the magic and metadata lines and
// the object.
std::vector<char> encode(const Metadata& m, const std::vector<char>& object);

// Parses `bytes` as an entry: on success fills `*m` and `*object` (if non-null) and returns "";
// otherwise returns what is wrong ("truncated object: ...", "checksum mismatch", ...). Checks the
// magic, metadata syntax and versions (this build's optfuse; the toolchain when `expect` names
// one), then the object's size and checksum, the checksum over the header and the object, and
// the object itself with `expect.check_object` when set (the engine's: an ELF relocatable object
// for the target's machine carrying the target Halide writes, jit/object_check.h). Only the
// metadata is checked when `object` is null and `check_object_bytes` is false. `*older_format`
// (if non-null) tells whether the entry is one of an earlier format, written by an older optfuse
// (not corrupt, but unusable).
std::string decode(const std::vector<char>& bytes, Metadata* m, std::vector<char>* object,
                   const CacheOptions& expect, bool check_object_bytes = true,
                   bool* older_format = nullptr);

// What is wrong with decoded entry `m` read for `key` and, when given, `info` ("" if nothing):
// another key (a misplaced or swapped file), kind, target or signature.
std::string mismatch(const Metadata& m, const std::string& key, const ObjectInfo* info);

}  // namespace optfuse::cache
