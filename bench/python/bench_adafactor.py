#!/usr/bin/env python3
"""optfuse.torch.Adafactor against torch.optim.Adafactor and a byte ceiling, in one process.

torch runs both ways: foreach=True and its for-loop (foreach=False: torch's default for
Adafactor).

Cases (float32, torch's defaults, weight_decay 0.01 so that every term runs):
  * one matrix of 2^--log2 elements (default 2^24: 4096 x 4096);
  * one vector of as many elements;
  * GPT-2 small's tensors (examples/specs/gpt2-small.json), every dim halved (--scale):
    matrices and vectors, 148 tensors;
  * ResNet-50's tensors (examples/specs/resnet50.json), every dim but the kernels' halved: 4-D
    conv weights factored per kh x kw kernel (batches of 3 x 3 and 1 x 1 matrices).
The ceiling is an optfuse.torch.Custom rule moving a factored step's bytes with trivial
arithmetic: p' = p + col_sum(g) + sum(g) + sum(p), one staged kernel reading g three times and p
twice (24 B/element, vectors too, where optfuse's vector kernel moves 32: its RMS prologue reads
p, g and variance, its update reads them again and writes p and variance). Every contender is
timed through opt.step(), two gradient sets alternating; contenders take turns within a round,
the order rotated each round; a figure is the median over rounds of the round's median step.
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
    Entry,
    add_timing_args,
    alternating_grads,
    interleaved_rounds,
    machine,
    spec_shapes,
)

# A factored step's traffic: g read three times (column sums, then two whole sums read g and p),
# p twice, p written: 24 B/element for a matrix (a vector has no column pass: 20).
CEILING = {
    "name": "ceiling_adafactor",
    "defaults": {"lr": 0.0},
    "graph": {
        "name": "ceiling_adafactor",
        "inputs": [{"name": "p", "role": "param"}, {"name": "g", "role": "grad"}],
        "nodes": [
            {"id": "c", "op": "col_sum", "args": ["g"]},
            {"id": "sg", "op": "reduce_sum", "args": ["g"]},
            {"id": "sp", "op": "reduce_sum", "args": ["p"]},
            {"id": "a", "op": "add", "args": ["p", "c"]},
            {"id": "b", "op": "add", "args": ["a", "sg"]},
            {"id": "p1", "op": "add", "args": ["b", "sp"]},
        ],
        "outputs": {"p": "p1"},
    },
}
KW = dict(weight_decay=0.01)


def entries_for(shapes):
    torch.manual_seed(0)
    base = [torch.randn(s).mul_(0.02) for s in shapes]
    grads = [[torch.randn(s).mul_(1e-3) for s in shapes] for _ in range(2)]

    def make(name, ctor):
        ps = [torch.nn.Parameter(b.clone()) for b in base]
        opt = ctor(ps)
        e = Entry(name, opt.step, alternating_grads(ps, grads), keep=opt)
        e.before()
        e.run()  # makes the state (and compiles optfuse's kernels) outside the timing
        return e

    return [
        make("optfuse.torch.Adafactor", lambda ps: oft.Adafactor(ps, **KW)),
        make(
            "torch Adafactor foreach=True", lambda ps: torch.optim.Adafactor(ps, foreach=True, **KW)
        ),
        make(
            "torch Adafactor foreach=False",
            lambda ps: torch.optim.Adafactor(ps, foreach=False, **KW),
        ),
        make("ceiling (24 B/element)", lambda ps: oft.Custom(ps, CEILING)),
    ]


def bytes_of(shapes):
    """A step's bytes: 24 per element of a matrix, 32 per element of a vector (its prologue
    reads p, g and variance, the update reads them again and writes p and variance)."""
    total = 0
    for s in shapes:
        n = 1
        for d in s:
            n *= d
        total += n * (24 if len(s) >= 2 else 32)
    return total


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--log2", type=int, default=24, help="elements of the one-tensor cases (24)")
    ap.add_argument("--scale", type=int, default=2, help="divide the model specs' dims (2)")
    ap.add_argument("--only", help="comma-separated case labels")
    ap.add_argument("--json", help="also write the figures here")
    add_timing_args(ap)
    a = ap.parse_args(argv)
    rounds, steps = a.rounds or 7, a.steps or 3
    n = 1 << a.log2
    side = 1 << (a.log2 // 2)
    resnet = [
        ([max(1, d // a.scale) if i < 2 else d for i, d in enumerate(s)], dec)
        for s, dec in spec_shapes("resnet50.json")
    ]
    cases = [
        (f"matrix {side} x {n // side}", [[side, n // side]]),
        (f"vector 2^{a.log2}", [[n]]),
        (f"GPT-2 small / {a.scale}", [s for s, _ in spec_shapes("gpt2-small.json", a.scale)]),
        (f"ResNet-50 / {a.scale}", [s for s, _ in resnet]),
    ]
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    info = machine()
    print(
        f"# {info['cpu']}, {info['cores']} cores, torch {info['torch']} "
        f"({info['torch_threads']} threads), optfuse {info['optfuse']} "
        f"({info['optfuse_threads']} threads), load {info['loadavg_start']:.2f}"
    )
    print(
        f"# float32, {rounds} rounds x {steps} steps (+{a.turn_warmup} untimed per turn), medians\n"
    )
    print("| case | contender | ms | GB/s (optfuse's bytes) | share of ceiling | x optfuse |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    out = {"machine": info, "rounds": rounds, "steps": steps, "cases": {}}
    only = set(a.only.split(",")) if a.only else None
    for label, shapes in cases:
        if only and not any(label.startswith(o) for o in only):
            continue
        log(f"{label}: {len(shapes)} tensors")
        entries = entries_for(shapes)
        for e in entries:
            for _ in range(a.warmup):
                e.before()
                e.run()
        interleaved_rounds(entries, rounds, steps, a.turn_warmup, log)
        med = {e.name: statistics.median(e.rounds) for e in entries}
        ours, ceil = med[entries[0].name], med[entries[-1].name]
        nbytes = bytes_of(shapes)
        out["cases"][label] = {"median_s": med, "bytes": nbytes}
        for e in entries:
            t = med[e.name]
            print(
                f"| {label} | {e.name} | {t * 1e3:.2f} | {nbytes / t / 1e9:.1f} | "
                f"{ceil / t:.2f} | {t / ours:.2f} |"
            )
        del entries
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
