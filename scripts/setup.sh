#!/usr/bin/env bash
# Installs what optfuse needs from Debian 12 (only what is missing; silent when nothing is) and
# builds it (Release) into build/. Run as root on Debian 12. Used by demo.sh and test.sh;
# `--no-build` only installs the packages (scripts/build_wheel.sh). Other arguments go to
# `cmake --build`.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  g++ make cmake
  llvm-14-dev libhalide14-0-dev   # LLVM 14 ORC and Halide 14 built on the same LLVM
  zlib1g-dev                      # LLVM's CMake package config asks for ZLIB
  libxxhash-dev nlohmann-json3-dev libcli11-dev
  libopenblas0                    # Muon's orthogonalization from C / C++ (loaded at run time)
  libgtest-dev libgmock-dev libbenchmark-dev
  python3-venv python3-dev        # the Python package (scripts/python_setup.sh)
  pkg-config                      # the installed-tree consumer test (tests/consumer/)
  clang-14 libclang-rt-14-dev     # the parsers' libFuzzer targets (tests/fuzz/, fuzz_smoke)
  clang-format-14                 # the format check (scripts/check_format.sh, CTest `format`)
)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

[[ "${1:-}" == "--no-build" ]] && exit 0
BUILD_DIR=${OPTFUSE_BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)" "$@"
