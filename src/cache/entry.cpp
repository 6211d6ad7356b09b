#include "cache/entry.h"

#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>

#include "jit/halide_bridge.h"

namespace optfuse::cache {

std::string hash_hex(const char* data, size_t size) {
  return xxh3_128(std::string_view(data, size)).hex();
}

Metadata make_metadata(const std::string& key, const ObjectInfo& info,
                       const std::vector<char>& object) {
  Metadata m;
  m.key = key;
  m.kind = info.kind;
  m.name = info.name;
  m.target = info.target;
  m.signature_xxh3 = hash_hex(info.signature.data(), info.signature.size());
  m.optfuse_version = OPTFUSE_VERSION;
  m.toolchain = jit::toolchain_version();
  m.object_bytes = object.size();
  m.object_xxh3 = hash_hex(object.data(), object.size());
  m.created = std::chrono::duration<double>(
                  std::chrono::system_clock::now().time_since_epoch()).count();
  return m;
}

std::vector<char> encode(const Metadata& m, const std::vector<char>& object) {
  nlohmann::json j = {{"format", kFormat},           {"key", m.key},
                      {"kind", m.kind},               {"name", m.name},
                      {"target", m.target},           {"signature_xxh3", m.signature_xxh3},
                      {"optfuse_version", m.optfuse_version}, {"toolchain", m.toolchain},
                      {"object_bytes", m.object_bytes}, {"object_xxh3", m.object_xxh3},
                      {"created", m.created}};
  std::string head = std::string(kMagic) + "\n" + j.dump() + "\n";
  std::vector<char> out(head.begin(), head.end());
  out.insert(out.end(), object.begin(), object.end());
  return out;
}

std::string decode(const std::vector<char>& bytes, Metadata* m, std::vector<char>* object,
                   bool check_object) {
  size_t magic_len = std::strlen(kMagic);
  if (bytes.size() < magic_len + 1 || std::memcmp(bytes.data(), kMagic, magic_len) != 0 ||
      bytes[magic_len] != '\n')
    return "not an optfuse cache entry of format " + std::to_string(kFormat) + " (bad magic line)";
  const char* begin = bytes.data() + magic_len + 1;
  const char* end = bytes.data() + bytes.size();
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
  if (m->toolchain != jit::toolchain_version())
    return "written with " + m->toolchain + ", this is " + jit::toolchain_version();
  size_t offset = static_cast<size_t>(newline + 1 - bytes.data());
  size_t have = bytes.size() - offset;
  if (!object && !check_object) return "";
  if (have != m->object_bytes)
    return (have < m->object_bytes ? "truncated object: " : "object too long: ") +
           std::to_string(have) + " bytes, metadata says " + std::to_string(m->object_bytes);
  if (hash_hex(bytes.data() + offset, have) != m->object_xxh3)
    return "object checksum mismatch (the object is corrupt)";
  if (object) object->assign(bytes.begin() + static_cast<std::ptrdiff_t>(offset), bytes.end());
  return "";
}

}  // namespace optfuse::cache
