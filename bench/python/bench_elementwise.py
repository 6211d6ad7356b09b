#!/usr/bin/env python3
"""optfuse.torch.Adadelta / ASGD / Rprop against torch.optim's own, with each one's byte
ceiling, in ONE process.

Per optimizer, one float32 tensor of 2^--log2 elements (default 24) and torch's defaults (ASGD
also with t0=0, where ax averages instead of copying the param). Contenders, each with its own
param and state: optfuse.torch's class; torch's foreach=True (its fastest implementation of
these: none has fused=True) and foreach=False (the for-loop, torch's CPU default); and the
ceiling, an optfuse.torch.Custom rule moving the optimizer's bytes with one add per output
(p, g, s1, s2 -> p, s1, s2 for Adadelta and Rprop: 28 B/element; p, g, ax -> p, ax for ASGD:
20). All are timed through opt.step(), two gradient sets alternating (zero_grad(set_to_none=True)
+ backward gives new tensors each step). The contenders take turns within a round, the order
rotated each round; a figure is the median over rounds of the round's median step.
"share" = ceiling time / contender time; "x optfuse" = contender time / optfuse's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch

import optfuse.torch as oft
from benchlib import (
    CEILING_RULE,
    Entry,
    add_timing_args,
    alternating_grads,
    interleaved_rounds,
    machine,
)

# p, g, ax -> p, ax (ASGD's traffic), as tools/bandwidth.h's graphs are built.
CEILING_3R2W = {
    "name": "ceiling_3r2w",
    "defaults": {"lr": 0.0},
    "graph": {
        "name": "ceiling_3r2w",
        "inputs": [
            {"name": "p", "role": "param"},
            {"name": "g", "role": "grad"},
            {"name": "ax", "role": "state"},
        ],
        "nodes": [
            {"id": "p1", "op": "add", "args": ["p", "g"]},
            {"id": "a1", "op": "add", "args": ["ax", "g"]},
        ],
        "outputs": {"p": "p1", "ax": "a1"},
    },
}

# (label, class name, keywords, bytes per element, ceiling rule)
CASES = [
    ("Adadelta", "Adadelta", {}, 28, CEILING_RULE),
    ("Rprop", "Rprop", {}, 28, CEILING_RULE),
    ("ASGD", "ASGD", {}, 20, CEILING_3R2W),
    ("ASGD t0=0 (averaging)", "ASGD", {"t0": 0.0}, 20, CEILING_3R2W),
]


def entries_for(cls_name, kw, ceiling, n):
    torch.manual_seed(0)
    base = torch.randn(n).mul_(0.02)
    grads = [[torch.randn(n).mul_(1e-3)] for _ in range(2)]

    def make(name, ctor):
        p = torch.nn.Parameter(base.clone())
        opt = ctor([p])
        e = Entry(name, opt.step, alternating_grads([p], grads), keep=opt)
        e.before()
        e.run()  # makes the state (and compiles optfuse's kernel) outside the timing
        return e

    torch_cls = getattr(torch.optim, cls_name)
    return [
        make(f"optfuse.torch.{cls_name}", lambda ps: getattr(oft, cls_name)(ps, **kw)),
        make(f"torch {cls_name} foreach=True", lambda ps: torch_cls(ps, foreach=True, **kw)),
        make(f"torch {cls_name} foreach=False", lambda ps: torch_cls(ps, foreach=False, **kw)),
        make(f"ceiling {ceiling['name']}", lambda ps: oft.Custom(ps, ceiling)),
    ]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--log2", type=int, default=24, help="elements: 2^LOG2 (24)")
    ap.add_argument("--only", help="comma-separated labels of CASES to run")
    ap.add_argument("--json", help="also write the figures here")
    add_timing_args(ap)
    a = ap.parse_args(argv)
    rounds, steps = a.rounds or 7, a.steps or 3
    n = 1 << a.log2
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    info = machine()
    print(
        f"# {info['cpu']}, {info['cores']} cores, torch {info['torch']} "
        f"({info['torch_threads']} threads), optfuse {info['optfuse']} "
        f"({info['optfuse_threads']} threads), load {info['loadavg_start']:.2f}"
    )
    print(
        f"# 2^{a.log2} float32 elements; {rounds} rounds x {steps} steps (+{a.turn_warmup} "
        f"untimed per turn), medians\n"
    )
    print("| optimizer | contender | ms | GB/s | share of ceiling | x optfuse |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    out = {"machine": info, "log2": a.log2, "rounds": rounds, "steps": steps, "cases": {}}
    only = set(a.only.split(",")) if a.only else None
    for label, cls_name, kw, bytes_per, ceiling in CASES:
        if only and label not in only:
            continue
        log(f"{label}:")
        entries = entries_for(cls_name, kw, ceiling, n)
        for e in entries:
            for _ in range(a.warmup):
                e.before()
                e.run()
        interleaved_rounds(entries, rounds, steps, a.turn_warmup, log)
        med = {e.name: statistics.median(e.rounds) for e in entries}
        ours, ceil = med[entries[0].name], med[entries[-1].name]
        out["cases"][label] = {"median_s": med, "bytes_per_element": bytes_per}
        for e in entries:
            t = med[e.name]
            print(
                f"| {label} | {e.name} | {t * 1e3:.2f} | {bytes_per * n / t / 1e9:.1f} | "
                f"{ceil / t:.2f} | {t / ours:.2f} |"
            )
        del entries
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
