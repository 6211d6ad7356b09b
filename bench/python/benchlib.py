"""What the Python benchmarks share (bench_torch.py, bench_amp.py, bench_capture.py): GPT-2
small's AdamW hyperparameters, the 4-read-3-write ceiling rule, the tensor layouts of
examples/specs/, and the interleaved timing rounds all their figures come from."""

from __future__ import annotations

import json
import os
import platform
import re
import statistics
import time
from pathlib import Path

import torch

import optfuse

ROOT = Path(__file__).resolve().parents[2]
HP = dict(lr=6e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)  # gpt2-small.json's AdamW
# optfuse's own 4r3w kernel (p' = p+g, m' = m+g, v' = v+g, f32, as tools/bandwidth.h), as an
# optfuse.torch.Custom rule: run over a case's tensors, it is the memory ceiling of that case.
CEILING_RULE = {
    "name": "ceiling_4r3w",
    "defaults": {"lr": 0.0},
    "graph": {
        "name": "ceiling_4r3w",
        "inputs": [
            {"name": "p", "role": "param"},
            {"name": "g", "role": "grad"},
            {"name": "exp_avg", "role": "state"},
            {"name": "exp_avg_sq", "role": "state"},
        ],
        "nodes": [
            {"id": "p1", "op": "add", "args": ["p", "g"]},
            {"id": "m1", "op": "add", "args": ["exp_avg", "g"]},
            {"id": "v1", "op": "add", "args": ["exp_avg_sq", "g"]},
        ],
        "outputs": {"p": "p1", "exp_avg": "m1", "exp_avg_sq": "v1"},
    },
}


def spec_shapes(spec_file: str, scale: int = 1):
    """(shape, decays) per tensor of a model spec in examples/specs/, every dim divided by
    `scale`; a tensor decays unless the spec's first param group (weight_decay 0) matches it."""
    spec = json.loads((ROOT / "examples/specs" / spec_file).read_text())
    no_decay = re.compile(spec["param_groups"][0]["match"])
    return [
        ([max(1, d // scale) for d in t["shape"]], not no_decay.search(t["name"]))
        for t in spec["parameters"]
    ]


def groups_of(params, decays):
    """Two param groups as the spec's: decay 0.1, and none on biases / layer norms / wpe."""
    gs = [
        {"params": [p for p, d in zip(params, decays) if d]},
        {"params": [p for p, d in zip(params, decays) if not d], "weight_decay": 0.0},
    ]
    return [g for g in gs if g["params"]]


def add_timing_args(ap) -> None:
    """The options interleaved_rounds() takes (--rounds and --steps default to None: a script
    sets its own defaults, smaller with --quick)."""
    ap.add_argument("--rounds", type=int, help="interleaved rounds (default 7, quick 3)")
    ap.add_argument(
        "--steps",
        type=int,
        help="timed steps per contender per round (3, quick 2; bench_torch.py: per case, enough "
        "for ~10 ms of optfuse steps a turn)",
    )
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps per contender (2)")
    ap.add_argument(
        "--turn-warmup",
        type=int,
        default=1,
        help="untimed steps at the start of each contender's turn in a round (1)",
    )


class Entry:
    """One contender for interleaved_rounds(): `run()` is timed, `before()` (None: nothing) runs
    untimed before every step; `keep` holds what its memory belongs to (an optimizer whose
    C++ step runs without it)."""

    def __init__(self, name, run, before=None, keep=None):
        self.name, self.run, self.before, self.keep = name, run, before, keep
        self.rounds: list[float] = []  # median step time of each round, seconds


def alternating_grads(params, gsets):
    """A before() that binds the other of the two gradient sets `gsets` (one tensor per param)
    to `params` at each call: new gradient tensors every step, as zero_grad(set_to_none=True)
    and backward give."""
    turn = [0]

    def before():
        turn[0] ^= 1
        for p, g in zip(params, gsets[turn[0]]):
            p.grad = g

    return before


def interleaved_rounds(entries, rounds: int, steps: int, turn_warmup: int, log) -> None:
    """Times `steps` steps of every entry per round, the entries taking turns in an order rotated
    each round, and appends each round's median step time (seconds) to the entry's `rounds`.
    An entry has `run()`, and may have `before()` and `after()` (None or absent: nothing), run
    untimed around every step. Each turn starts with `turn_warmup` untimed steps, which wake the
    entry's threads after the others ran."""

    def noop():
        pass

    for r in range(rounds):
        k = r % len(entries)
        for e in entries[k:] + entries[:k]:
            before = getattr(e, "before", None) or noop
            after = getattr(e, "after", None) or noop
            for _ in range(turn_warmup):
                before()
                e.run()
                after()
            ts = []
            for _ in range(steps):
                before()
                t0 = time.perf_counter()
                e.run()
                ts.append(time.perf_counter() - t0)
                after()
            e.rounds.append(statistics.median(ts))
        log(f"  round {r + 1}/{rounds} done")


def machine() -> dict:
    """The machine and versions a run's figures belong to, with the load average at its start."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = re.search(r"^model name\s*:\s*(.*)$", info, re.M)
    flags = re.search(r"^flags\s*:\s*(.*)$", info, re.M)
    return {
        "cpu": model.group(1).strip() if model else platform.processor(),
        "avx512f": bool(flags and "avx512f" in flags.group(1).split()),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "optfuse": optfuse.__version__,
        "optfuse_threads": optfuse.engine().threads,
        "target": optfuse.engine().target,
        "python": platform.python_version(),
        "loadavg_start": os.getloadavg()[0],
    }
