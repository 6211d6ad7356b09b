#!/usr/bin/env bash
# Installs the build tree BUILD into a temporary prefix, then builds and runs a C++ and a C
# program against it twice: through find_package(optfuse) (tests/consumer/CMakeLists.txt) and
# through pkg-config. Usage: run.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
BUILD=$1
SRC=$2
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cmake --install "$BUILD" --prefix "$WORK/prefix" >/dev/null
echo "== find_package"
cmake -S "$SRC/tests/consumer" -B "$WORK/build" -DCMAKE_PREFIX_PATH="$WORK/prefix" \
  -DC_EXAMPLE="$SRC/examples/c_api.c" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$WORK/build" -j2 >/dev/null
"$WORK/build/consumer_cpp"
"$WORK/build/consumer_c" >/dev/null && echo "consumer_c: ok"
echo "== pkg-config"
export PKG_CONFIG_PATH="$WORK/prefix/lib/pkgconfig:$WORK/prefix/lib/x86_64-linux-gnu/pkgconfig"
g++ -std=c++17 -O1 "$SRC/tests/consumer/main.cpp" -o "$WORK/pc_cpp" $(pkg-config --cflags --libs optfuse)
gcc -O1 "$SRC/examples/c_api.c" -o "$WORK/pc_c" $(pkg-config --cflags --libs optfuse) -lm
LIB=$(pkg-config --variable=libdir optfuse)
LD_LIBRARY_PATH="$LIB" "$WORK/pc_cpp"
LD_LIBRARY_PATH="$LIB" "$WORK/pc_c" >/dev/null && echo "pc_c: ok"
