#!/usr/bin/env python3
"""Reads a bench_update JSON file (--benchmark_out=FILE) and prints, per size, each variant's
bytes/s and its ratios to the ceiling with the same traffic and to the fused kernel. With
--benchmark_repetitions it uses the median aggregate; otherwise the single run."""

import json
import sys
from collections import defaultdict

CEILING = {"AdamW": "Ceiling_4R3W", "SGDMomentum": "Ceiling_3R2W"}
# What each paired benchmark's ratio is (speed of the first named over the second).
PAIRED = {
    "Paired_AdamW_Ceiling": "paired AdamW_Fused / Ceiling_4R3W",
    "Paired_AdamW_Ceiling_NoPrefetch": "paired AdamW_Fused / Ceiling_4R3W (no prefetch)",
    "Paired_AdamW_Ceiling_NoL2Prefetch": "paired AdamW_Fused / Ceiling_4R3W (no L2 prefetch)",
    "Paired_AdamW_Ceiling_Tuned": "paired AdamW_Fused / Ceiling_4R3W (tuned schedule)",
    "Paired_AdamW_L2Prefetch_Speedup": "paired AdamW_Fused, with / without L2 prefetch (speed-up)",
}


def load(path):
    runs = json.load(open(path))["benchmarks"]
    has_median = any(r.get("aggregate_name") == "median" for r in runs)
    bps = defaultdict(dict)  # size -> variant -> bytes/s
    paired = defaultdict(dict)  # size -> paired variant -> (ratio_median, ratio_min)
    for r in runs:
        if r.get("error_occurred"):
            continue
        if has_median and r.get("aggregate_name") != "median":
            continue
        variant, size = r["run_name"].split("/")[:2]
        if "ratio_median" in r:
            paired[int(size)][variant.removeprefix("BM_")] = (r["ratio_median"], r["ratio_min"])
        else:
            bps[int(size)][variant.removeprefix("BM_")] = r["bytes_per_second"]
    return bps, paired


def main(path):
    bps, paired = load(path)
    for size in sorted(set(bps) | set(paired)):
        v = bps[size]
        print(f"n = 2^{size.bit_length() - 1} ({size})")
        for name, (med, fastest) in sorted(paired.get(size, {}).items()):
            print(f"  {PAIRED.get(name, name)}: median {med:.2f}, fastest {fastest:.2f}")
        for name, b in sorted(v.items()):
            line = f"  {name:<20} {b / 1e9:7.2f} GB/s"
            algo = name.split("_")[0]
            if algo in CEILING and CEILING[algo] in v:
                line += f"   / ceiling {b / v[CEILING[algo]]:5.2f}"
            if algo + "_Fused" in v and not name.endswith("_Fused"):
                line += f"   fused / this {v[algo + '_Fused'] / b:6.2f}"
            print(line)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bench_update.json")
