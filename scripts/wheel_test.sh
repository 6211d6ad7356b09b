#!/usr/bin/env bash
# The wheel as a user gets it (docs/building.md, "What CI checks"): builds it
# (scripts/build_wheel.sh), installs it with `pip install --no-index` into a fresh virtual
# environment that holds nothing but torch, and runs it where the system's Halide, LLVM, xxHash
# and Z3 libraries and this checkout cannot be found: in a private mount namespace, each of those
# files is covered by an empty file (a loader that still looked there would fail on it) and the
# checkout by an empty directory. There it runs tests/wheel/smoke.py (a training step whose
# kernel compiles into an empty cache, against torch.optim.AdamW, and /proc/self/maps: Halide,
# LLVM and xxHash mapped from the wheel's optfuse.libs only), `optfuse --help` and a short
# `optfuse demo`. Where no mount namespace can be made, it says so and relies on the maps check.
# Run as root on Debian 12 (scripts/test.sh runs it last). Safe to run again: it starts afresh
# in $OPTFUSE_WHEEL_TEST_DIR (default /tmp/optfuse-wheel-test), outside the checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
start=$SECONDS

# $OPTFUSE_WHEEL: test that wheel instead of building one (e.g. the unrepaired one in
# build/wheel/pinned, which must fail here).
whl=$(realpath "${OPTFUSE_WHEEL:-$(bash scripts/build_wheel.sh | tail -1)}")
VENV=${OPTFUSE_VENV:-$HOME/.cache/optfuse/venv}  # built the wheel; lends the test its torch
T=${OPTFUSE_WHEEL_TEST_DIR:-${TMPDIR:-/tmp}/optfuse-wheel-test}
case "$(realpath -m "$T")/" in "$ROOT"/*)
  echo "wheel_test: $T must be outside the checkout (which the test hides)" >&2; exit 1;; esac
rm -rf "$T"
mkdir -p "$T/cache" "$T/cache-demo" "$T/xdg" "$T/torch-site" "$T/empty-dir"
: >"$T/empty-file"
cp tests/wheel/smoke.py "$T/"

# The fresh venv: the build venv's interpreter (the wheel's Python version), and torch lent by
# a .pth file naming a directory of links to torch and the distributions it requires, nothing
# else of the build venv (no optfuse, no build tools). A new download of torch would take
# minutes and gigabytes for the same files.
base=$("$VENV/bin/python" -c "import sys; print(sys._base_executable)")
"$base" -m venv "$T/venv"
"$VENV/bin/python" - "$T/torch-site" <<'PYEOF'
import importlib.metadata as md, os, sys
from packaging.requirements import Requirement  # (scikit-build-core's dependency)
from packaging.utils import canonicalize_name
dest, todo, seen = sys.argv[1], [("torch", ())], set()
while todo:
    name, extras = todo.pop()
    if (canonicalize_name(name), extras) in seen:
        continue
    seen.add((canonicalize_name(name), extras))
    try:
        dist = md.distribution(name)
    except md.PackageNotFoundError:
        continue  # required only on other platforms
    for r in map(Requirement, dist.requires or []):
        if r.marker is None or any(r.marker.evaluate({"extra": e}) for e in extras or ("",)):
            todo.append((r.name, tuple(sorted(r.extras))))
    for top in {f.parts[0] for f in dist.files or []} - {"..", "__pycache__"}:
        src = os.path.join(str(dist.locate_file("")), top)
        if os.path.exists(src) and not os.path.lexists(os.path.join(dest, top)):
            os.symlink(src, os.path.join(dest, top))
PYEOF
site=$("$T/venv/bin/python" -c "import sysconfig; print(sysconfig.get_path('purelib'))")
echo "$T/torch-site" >"$site/torch-site.pth"
# (A Python 3.11 venv starts with its own, older setuptools, which would shadow the one torch
# requires.)
"$T/venv/bin/python" -m pip uninstall -q -y --disable-pip-version-check setuptools 2>/dev/null || true
# --no-index: the wheel's requirements (torch of the release it was built against) must be met
# by what is there.
"$T/venv/bin/python" -m pip install -q --disable-pip-version-check --no-index "$whl"

# What the run must not find: every shared or static library file of Debian's Halide, LLVM,
# xxHash and Z3 packages (runtime and -dev), their other folders, and this checkout (with its
# build trees).
hide_files=() hide_dirs=("$ROOT")
while read -r f; do
  [[ -f "$f" && ! -L "$f" ]] && hide_files+=("$f")
done < <(dpkg -L libhalide14-0 libhalide14-0-dev libllvm14 llvm-14-dev libxxhash0 libxxhash-dev \
           libz3-4 2>/dev/null | grep -E '\.so(\.[0-9.]+)?$|\.a$')
for d in /usr/lib/llvm-14 /usr/include/halide14 /usr/lib/x86_64-linux-gnu/halide14 \
         "$(realpath -m "${OPTFUSE_BUILD_DIR:-build}")"; do
  [[ -d "$d" && "$d/" != "$ROOT"/* ]] && hide_dirs+=("$d")  # (the checkout's own are hidden)
done
runner=()
if unshare --mount --propagation private true 2>/dev/null; then
  runner=(unshare --mount --propagation private "$T/hidden.sh")
  {
    echo '#!/bin/bash'
    echo 'set -e'
    for f in "${hide_files[@]}"; do printf 'mount --bind %q %q\n' "$T/empty-file" "$f"; done
    for d in "${hide_dirs[@]}"; do printf 'mount --bind %q %q\n' "$T/empty-dir" "$d"; done
    echo 'exec "$@"'
  } >"$T/hidden.sh"
  chmod +x "$T/hidden.sh"
  echo "wheel_test: hiding ${#hide_files[@]} library files of Debian's Halide, LLVM, xxHash," \
    "Z3 and ${#hide_dirs[@]} folders (the checkout, the build tree, LLVM's and Halide's)" >&2
else
  echo "wheel_test: WARNING: no mount namespace (unshare --mount not permitted): the system" \
    "libraries stay visible; only /proc/self/maps in the smoke test tells where they came from" >&2
fi

run() {
  (cd "$T" && env -u LD_LIBRARY_PATH -u PYTHONPATH -u OPTFUSE_SCHEDULES \
     XDG_DATA_HOME="$T/xdg" OPTFUSE_CACHE_DIR="$T/cache" ${runner[@]+"${runner[@]}"} "$@")
}
run "$T/venv/bin/python" -I "$T/smoke.py"
run "$T/venv/bin/optfuse" --help >"$T/help.txt"
grep -q "demo" "$T/help.txt" || { cat "$T/help.txt" >&2; exit 1; }
run "$T/venv/bin/optfuse" demo --steps 2 --layers 1 --d-model 64 --vocab 512 \
  --cache-dir "$T/cache-demo" >"$T/demo.txt"
grep -q "^kernels " "$T/demo.txt" || { cat "$T/demo.txt" >&2; exit 1; }
grep "^kernels " "$T/demo.txt" | sed 's/^/wheel_test: optfuse demo: /' >&2
echo "wheel_test: ok: $(basename "$whl") ($(($(stat -c %s "$whl") / 1000000)) MB) installed into a fresh" \
  "venv and run without the system's Halide, LLVM and xxHash ($((SECONDS - start)) s in all)"
