#!/usr/bin/env python3
"""Fails when a comment names a file of this repository that does not exist.

Looks at the comments of C / C++ / Python / CMake / shell files: a path such as
`src/lower/prefetch.h` must exist (a `foo.*` stands for any extension), and a bare file name such
as `idiom_rules.cpp` must be the name of some tracked file. Names of files that programs create
(a checkpoint, a database written by a test) are fine in strings, not in comments; where a
comment must name one, write it as `<name>` or add it to ALLOWED. CTest runs it as
`comment_names`.
"""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXTS = {".c", ".cpp", ".h", ".hpp", ".py", ".sh", ".cmake", ".txt", ".in"}
TOP = (
    "src",
    "include",
    "tests",
    "bench",
    "tools",
    "docs",
    "scripts",
    "cmake",
    "examples",
    "python",
    "cache",
    "schedules",
    ".ci",
)
PATH = re.compile(r"(?<![\w./-])((?:%s)/[\w./*-]*[\w*])" % "|".join(re.escape(t) for t in TOP))
NAME = re.compile(r"(?<![\w./<-])([A-Za-z_][\w-]*\.(?:cpp|hpp|h|c|py|sh|md|def|cmake))\b")
# Names a comment may use that are not files here: system and third-party headers, files that
# programs write.
ALLOWED = {
    "Halide.h",
    "xxhash.h",
    "elf.h",
    "dlfcn.h",
    "CLI.hpp",
    "json.hpp",
    "gtest.h",
    "benchmark.h",
    "cuda.h",
    "omp.h",
    "setup.py",
    "conftest.py",
    "__init__.py",
    "HalideRuntime.h",
    "HalideRuntimeCuda.h",
    "HalideBuffer.h",
    "Python.h",
    "libgomp.h",
    "nanobind.h",
}


def comments(path: Path, text: str):
    """(line number, comment text) pairs."""
    if path.suffix in {".py", ".sh", ".cmake", ".txt", ".in"}:
        for i, line in enumerate(text.splitlines(), 1):
            at = line.find("#")
            if at >= 0 and not line.lstrip().startswith(("#include", "#!")):
                yield i, line[at:]
        if path.suffix == ".py":  # docstrings
            for m in re.finditer(r'"""(.*?)"""', text, re.S):
                yield text.count("\n", 0, m.start()) + 1, m.group(1)
        return
    for i, line in enumerate(text.splitlines(), 1):
        at = line.find("//")
        if at >= 0:
            yield i, line[at:]
    for m in re.finditer(r"/\*(.*?)\*/", text, re.S):
        yield text.count("\n", 0, m.start()) + 1, m.group(1)


def main() -> int:
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    names = {Path(t).name for t in tracked}
    problems = []
    for rel in tracked:
        path = ROOT / rel
        if path.suffix not in EXTS or "fuzz/corpus" in rel or not path.is_file():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        for line, comment in comments(path, text):
            for p in PATH.findall(comment):
                p = p.rstrip(".")
                if "*" in p or "<" in p:
                    base = p.split("*")[0].rstrip(".")
                    if not list(ROOT.glob(p)) and not list(ROOT.glob(base + "*")):
                        problems.append(f"{rel}:{line}: {p} matches no file")
                elif not (ROOT / p).exists():
                    problems.append(f"{rel}:{line}: {p} does not exist")
            for n in NAME.findall(comment):
                if n not in names and n not in ALLOWED:
                    problems.append(f"{rel}:{line}: no file is named {n}")
    for p in problems:
        print("comment_names:", p)
    print(f"comment_names: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
