#!/usr/bin/env bash
# Fails when a tracked C, C++ or header file differs from what .clang-format makes of it (CTest
# `format`). To fix: scripts/check_format.sh --fix
set -euo pipefail
cd "$(dirname "$0")/.."
format=$(command -v clang-format-14 || command -v clang-format || true)
if [[ -z "$format" ]]; then
  echo "format: clang-format-14 not found (scripts/setup.sh installs it)"
  exit 1
fi
mapfile -t files < <(git ls-files '*.c' '*.cpp' '*.h' '*.hpp' 2>/dev/null ||
                     find include src tools tests bench python examples -name '*.[ch]' -o -name '*.[ch]pp')
if [[ "${1:-}" == "--fix" ]]; then
  "$format" -i "${files[@]}"
  echo "format: ${#files[@]} files formatted"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  "$format" --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if ((${#bad[@]})); then
  printf 'format: not as .clang-format makes it: %s\n' "${bad[@]}"
  echo "format: ${#bad[@]} of ${#files[@]} files; run scripts/check_format.sh --fix"
  exit 1
fi
echo "format: ${#files[@]} files as .clang-format makes them"
