#pragma once
// What is wrong with a compiled object as one for `target` ("" if nothing): the check a cache
// entry's object gets before it may reach ORC (CacheOptions::check_object, include/optfuse/
// cache.h, set by the engine). ORC links an object built for another machine without complaint,
// and calling into it then crashes the process.
#include <cstddef>
#include <string>

namespace optfuse::jit {

// `kind`: "kernel" or "runtime". Checks that the object is an ELF relocatable object of the
// target's machine (elf.h) and, for a kernel, that it carries the target text Halide's code
// generator writes into the pipeline's metadata (kernel_object_target, halide_bridge.h): an
// AVX-512 kernel relabelled as AVX2 has the same ELF machine.
std::string object_problem(const std::string& kind, const std::string& target, const char* data,
                           size_t size);

}  // namespace optfuse::jit
