#include "cache/entry.h"

#include <xxhash.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <new>
#include <nlohmann/json.hpp>
#include <string_view>

namespace optfuse::cache {
namespace {

// The checksum line's hash: XXH3-128 of the magic and metadata lines (`head`, with their
// newlines) followed by the object, so that an edit of any header field is caught as surely as
// one of the object.
std::string entry_hash(std::string_view head, const char* object, size_t size) {
  std::unique_ptr<XXH3_state_t, XXH_errorcode (*)(XXH3_state_t*)> state(XXH3_createState(),
                                                                        &XXH3_freeState);
  if (!state) throw std::bad_alloc();
  XXH3_128bits_reset(state.get());
  XXH3_128bits_update(state.get(), head.data(), head.size());
  XXH3_128bits_update(state.get(), object, size);
  XXH128_hash_t h = XXH3_128bits_digest(state.get());
  return Hash128{h.high64, h.low64}.hex();
}

constexpr size_t kHashDigits = 32;

}  // namespace

std::string hash_hex(const char* data, size_t size) {
  return xxh3_128(std::string_view(data, size)).hex();
}

Metadata make_metadata(const std::string& key, const ObjectInfo& info,
                       const std::vector<char>& object, const std::string& toolchain) {
  Metadata m;
  m.key = key;
  m.kind = info.kind;
  m.name = info.name;
  m.target = info.target;
  m.signature_xxh3 = hash_hex(info.signature.data(), info.signature.size());
  m.optfuse_version = OPTFUSE_VERSION;
  m.toolchain = toolchain;
  m.object_bytes = object.size();
  m.object_xxh3 = hash_hex(object.data(), object.size());
  m.created =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  return m;
}

std::vector<char> encode(const Metadata& m, const std::vector<char>& object) {
  nlohmann::json j = {{"format", kFormat},
                      {"key", m.key},
                      {"kind", m.kind},
                      {"name", m.name},
                      {"target", m.target},
                      {"signature_xxh3", m.signature_xxh3},
                      {"optfuse_version", m.optfuse_version},
                      {"toolchain", m.toolchain},
                      {"object_bytes", m.object_bytes},
                      {"object_xxh3", m.object_xxh3},
                      {"created", m.created}};
  std::string head = std::string(kMagic) + "\n" + j.dump() + "\n";
  std::string sum = entry_hash(head, object.data(), object.size()) + "\n";
  std::vector<char> out(head.begin(), head.end());
  out.insert(out.end(), sum.begin(), sum.end());
  out.insert(out.end(), object.begin(), object.end());
  return out;
}

std::string decode(const std::vector<char>& bytes, Metadata* m, std::vector<char>* object,
                   const CacheOptions& expect, bool check_object_bytes, bool* older_format) {
  if (older_format) *older_format = false;
  const char* end = bytes.data() + bytes.size();
  size_t magic_len = std::strlen(kMagic), prefix_len = std::strlen(kMagicPrefix);
  if (bytes.size() < magic_len + 1 || std::memcmp(bytes.data(), kMagic, magic_len) != 0 ||
      bytes[magic_len] != '\n') {
    // Another format's magic line: "optfuse-cache-entry <n>".
    const char* newline = static_cast<const char*>(std::memchr(bytes.data(), '\n', bytes.size()));
    std::string line = newline ? std::string(bytes.data(), newline) : std::string();
    std::string number = line.size() > prefix_len && line.compare(0, prefix_len, kMagicPrefix) == 0
                             ? line.substr(prefix_len)
                             : std::string();
    if (!number.empty() && number.size() < 6 &&
        number.find_first_not_of("0123456789") == std::string::npos) {
      bool older = std::stoi(number) < kFormat;
      if (older_format) *older_format = older;
      return "written in entry format " + number + " by " + (older ? "an older" : "a newer") +
             " optfuse (this one reads format " + std::to_string(kFormat) + ")";
    }
    return "not an optfuse cache entry of format " + std::to_string(kFormat) + " (bad magic line)";
  }
  const char* begin = bytes.data() + magic_len + 1;
  const char* newline = static_cast<const char*>(std::memchr(begin, '\n', end - begin));
  if (!newline) return "truncated metadata";
  nlohmann::json j = nlohmann::json::parse(begin, newline, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return "corrupt metadata (not a JSON object)";
  try {
    if (j.at("format").get<int>() != kFormat) return "unknown format " + j.at("format").dump();
    m->key = j.at("key").get<std::string>();
    m->kind = j.at("kind").get<std::string>();
    m->name = j.at("name").get<std::string>();
    m->target = j.at("target").get<std::string>();
    m->signature_xxh3 = j.at("signature_xxh3").get<std::string>();
    m->optfuse_version = j.at("optfuse_version").get<std::string>();
    m->toolchain = j.at("toolchain").get<std::string>();
    m->object_bytes = j.at("object_bytes").get<uint64_t>();
    m->object_xxh3 = j.at("object_xxh3").get<std::string>();
    m->created = j.at("created").get<double>();
  } catch (const nlohmann::json::exception& e) {
    return std::string("corrupt metadata (") + e.what() + ")";
  }
  if (m->optfuse_version != OPTFUSE_VERSION)
    return "written by optfuse " + m->optfuse_version + ", this is " + OPTFUSE_VERSION;
  if (!expect.toolchain.empty() && m->toolchain != expect.toolchain)
    return "written with " + m->toolchain + ", this is " + expect.toolchain;
  if (!object && !check_object_bytes) return "";
  std::string_view head(bytes.data(), static_cast<size_t>(newline + 1 - bytes.data()));
  const char* sum = newline + 1;
  if (static_cast<size_t>(end - sum) < kHashDigits + 1 || sum[kHashDigits] != '\n')
    return "truncated entry (no checksum line)";
  size_t offset = head.size() + kHashDigits + 1;
  size_t have = bytes.size() - offset;
  const char* obj = bytes.data() + offset;
  if (have != m->object_bytes)
    return (have < m->object_bytes ? "truncated object: " : "object too long: ") +
           std::to_string(have) + " bytes, metadata says " + std::to_string(m->object_bytes);
  if (hash_hex(obj, have) != m->object_xxh3)
    return "object checksum mismatch (the object is corrupt)";
  if (entry_hash(head, obj, have) != std::string_view(sum, kHashDigits))
    return "entry checksum mismatch (the header was edited or is corrupt)";
  if (expect.check_object)
    if (std::string why = expect.check_object(m->kind, m->target, obj, have); !why.empty())
      return why;
  if (object) object->assign(obj, end);
  return "";
}

std::string mismatch(const Metadata& m, const std::string& key, const ObjectInfo* info) {
  if (m.key != key) return "it holds key " + m.key + " (a misplaced or swapped file)";
  if (!info) return "";
  if (!info->kind.empty() && m.kind != info->kind)
    return "it holds a " + m.kind + ", expected a " + info->kind;
  if (!info->target.empty() && m.target != info->target)
    return "it is for target " + m.target + ", expected " + info->target;
  if (!info->signature.empty() &&
      m.signature_xxh3 != hash_hex(info->signature.data(), info->signature.size()))
    return "its kernel signature does not match the kernel's";
  return "";
}

}  // namespace optfuse::cache
