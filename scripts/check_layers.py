#!/usr/bin/env python3
"""Fails when a stage includes a stage above it (a back-edge, the start of an include cycle).

The stages, bottom to top, are the folders of src/ and the public headers of include/optfuse/
that belong to them (docs/architecture.md, "Layers"). A file may include its own stage and any
stage below it. Run from anywhere: `python3 scripts/check_layers.py` (CTest runs it as `layers`).
"""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# (stage, public headers of that stage); src/<stage>/ is the stage's code.
STAGES = [
    ("types", ["error.h", "dtype.h"]),
    ("graph", ["graph.h", "ops.def", "idioms.h", "partition.h"]),
    ("kernel", ["schedule.h", "kernel.h", "object_store.h"]),  # types the stages share
    ("lower", []),
    ("jit", ["parallel.h"]),
    ("cache", ["cache.h"]),
    ("engine", ["engine.h", "schedules.h"]),
    ("tune", ["tune.h"]),
    ("optim", ["optim.h"]),
    ("capi", ["optfuse.h", "optfuse.hpp"]),
]
RANK = {name: i for i, (name, _) in enumerate(STAGES)}
HEADER_STAGE = {h: name for name, headers in STAGES for h in headers}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def stage_of_include(path: str):
    if path.startswith("optfuse/"):
        return HEADER_STAGE.get(path[len("optfuse/") :], "?" + path)
    top = path.split("/", 1)[0]
    return top if top in RANK else None  # e.g. a generated or third-party header


def main() -> int:
    problems = []
    files = [(p, p.parent.name) for p in sorted((ROOT / "src").glob("*/*")) if p.is_file()]
    files += [
        (p, HEADER_STAGE.get(p.name, "?" + p.name))
        for p in sorted((ROOT / "include/optfuse").iterdir())
    ]
    for path, stage in files:
        if stage not in RANK:
            problems.append(f"{path.relative_to(ROOT)}: not in any stage (scripts/check_layers.py)")
            continue
        for inc in INCLUDE.findall(path.read_text(encoding="utf-8", errors="replace")):
            target = stage_of_include(inc)
            if target is None:
                continue
            if target not in RANK:
                problems.append(f"{path.relative_to(ROOT)}: includes {inc}, which is in no stage")
            elif RANK[target] > RANK[stage]:
                problems.append(
                    f"{path.relative_to(ROOT)} ({stage}) includes {inc} ({target}), "
                    f"a stage above it"
                )
    for p in problems:
        print("layers:", p)
    print(
        f"layers: {len(files)} files, {len(problems)} problem(s); stages bottom to top: "
        + " < ".join(name for name, _ in STAGES)
    )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
