"""What optfuse.torch costs on top of the C++ step it runs, in one process.

For each case, four contenders take turns round by round (benchlib.interleaved_rounds):

  optfuse.torch.AdamW          opt.step() with new gradients every step (two sets alternating,
                               as zero_grad(set_to_none=True) and backward give): every check of
                               every param and gradient, the gradients rebound, in C++
  C++ step                     the same optimizer's C++ core, the gradients rebound by
                               core.set_grads with addresses computed beforehand, then
                               core.step(): what the C / C++ API user runs, no checks
  ... same grads               both again with the gradients left as they are

and the report gives the ratio of the optfuse.torch step to the C++ step (1.00: Python adds
nothing). Issue 31's marks: 1000 x 1K within 1.2x, GPT-2 small within 1.02x.

    ~/.cache/optfuse/venv/bin/python bench/python/bench_overhead.py            # both cases
    ~/.cache/optfuse/venv/bin/python bench/python/bench_overhead.py --cases small --rounds 11
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch

import optfuse.torch as oft
from benchlib import (
    HP,
    Entry,
    add_timing_args,
    groups_of,
    interleaved_rounds,
    machine,
    spec_shapes,
)

CASES = {
    "small": ("1000 x 1K", lambda: [([1024], True)] * 1000),
    "gpt2": ("GPT-2 small", lambda: spec_shapes("gpt2-small.json")),
}


def entries_for(shapes):
    torch.manual_seed(0)
    decays = [d for _, d in shapes]
    params = [torch.nn.Parameter(torch.randn(s).mul_(0.02)) for s, _ in shapes]
    gsets = [[torch.randn(s).mul_(1e-3) for s, _ in shapes] for _ in range(2)]
    opt = oft.AdamW(groups_of(params, decays), **HP)
    turn = [0]

    def new_grads():
        turn[0] ^= 1
        for p, g in zip(params, gsets[turn[0]]):
            p.grad = g

    new_grads()
    opt.step()
    b = opt._optfuse_binding
    index = {id(p): i for i, p in enumerate(params)}
    ptrs = [
        [(g.cpp, [gs[index[id(p)]].data_ptr() for p in g.params]) for g in b.groups] for gs in gsets
    ]
    core = b.core

    def raw():
        for cpp, addresses in ptrs[turn[0]]:
            core.set_grads(cpp, addresses)
        core.step()

    return opt, [
        Entry("optfuse.torch.AdamW", opt.step, new_grads),
        Entry("C++ step", raw, new_grads),
        Entry("optfuse.torch.AdamW, same grads", opt.step),
        Entry("C++ step, same grads", core.step),
    ]


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--cases", default="small,gpt2", help="small, gpt2 (default both)")
    ap.add_argument("--json", metavar="FILE", help="every round's figures as JSON")
    add_timing_args(ap)
    a = ap.parse_args()
    rounds, steps = a.rounds or 9, a.steps or 20
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    m = machine()
    print(
        f"# optfuse.torch against its C++ step\n\nCPU: {m['cpu']}, AVX-512: {m['avx512f']}, "
        f"{m['cores']} cores, torch {m['torch']}; {rounds} rounds of {steps} steps, medians\n"
    )
    print(
        "| case | optfuse.torch step | C++ step | ratio | same grads: optfuse.torch | C++ | "
        "ratio |\n|---|---:|---:|---:|---:|---:|---:|"
    )
    out = {"machine": m, "cases": {}}
    for key in a.cases.split(","):
        title, shapes = CASES[key]
        log(f"{title}: building")
        keep, entries = entries_for(shapes())
        for e in entries:
            for _ in range(a.warmup):
                (e.before or (lambda: None))()
                e.run()
        interleaved_rounds(entries, rounds, steps, a.turn_warmup, log)
        med = {e.name: statistics.median(e.rounds) for e in entries}
        ms = {k: v * 1e3 for k, v in med.items()}
        r_new = med["optfuse.torch.AdamW"] / med["C++ step"]
        r_same = med["optfuse.torch.AdamW, same grads"] / med["C++ step, same grads"]
        print(
            f"| {title} | {ms['optfuse.torch.AdamW']:.3f} ms | {ms['C++ step']:.3f} ms | "
            f"{r_new:.3f} | {ms['optfuse.torch.AdamW, same grads']:.3f} ms | "
            f"{ms['C++ step, same grads']:.3f} ms | {r_same:.3f} |",
            flush=True,
        )
        out["cases"][key] = {
            "title": title,
            "ratio_new_grads": r_new,
            "ratio_same_grads": r_same,
            "rounds_s": {e.name: e.rounds for e in entries},
        }
        del keep
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
