#!/usr/bin/env python3
"""optfuse.torch.AdamW against torch.optim.AdamW (fused / foreach / the for-loop / torch.compile)
and DeepSpeed's CPU Adam, with a 4-read-3-write memory ceiling over the same tensors.

Everything runs in ONE process. Per case, every contender gets its own params and state (the two
gradient sets are shared, read-only) and runs --steps timed steps per round; the contenders take
turns within a round (order rotated each round), and each figure is the median over rounds of the
round's median step. Before every step the params get the other gradient set, as
zero_grad(set_to_none=True) + backward gives new gradient tensors each step (optfuse rebinds).

Cases: GPT-2 small and ResNet-50 are the tensor layouts of examples/specs/ (both with this AdamW,
no decay where the spec's first group has none), 1000 x 1K, and flatN, one tensor of 2^N.

Bytes model (GB/s column): AdamW moves 4 reads + 3 writes of 4 bytes = 28 B/element (p, g, m, v
read; p, m, v written). bf16 params with f32 master: master, grad (bf16), m, v read, master, m, v,
param (bf16) written = 4+2+4+4 + 4+4+4+2 = 28 B/element too. The ceiling is optfuse's own 4r3w
kernel (p' = p+g, m' = m+g, v' = v+g, f32, as tools/bandwidth.h) as an optfuse.torch.Custom rule
over the same tensor list, same engine, threads and per-tensor calls, timed through its C++ step.
"share" = ceiling time / contender time over the same elements; "x optfuse" = time / optfuse's.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import optfuse
import optfuse.torch as oft
from optfuse import _core
from optfuse.torch._binding import DTYPE_NAMES, TORCH_DTYPES

import benchlib
from torch_report import markdown, plot
from benchlib import (
    CEILING_RULE,
    HP,
    add_timing_args,
    alternating_grads,
    groups_of,
    interleaved_rounds,
    machine,
    spec_shapes,
)


# ---- cases -------------------------------------------------------------------------------------


def gpt2_shapes(scale: int):
    return spec_shapes("gpt2-small.json", scale)


def make_cases(a):
    """The cases named in --cases, in that order. flatN: one tensor of 2^N elements (2^(N-4)
    with --quick); gpt2 / resnet50: the layouts of examples/specs/ (dims / 8 with --quick)."""
    q = a.quick
    scaled = " (dims / 8)" if q else ""
    gpt = gpt2_shapes(8 if q else 1)
    cases = {
        "gpt2": ("GPT-2 small" + scaled, gpt, torch.float32),
        "resnet50": (
            "ResNet-50" + scaled,
            spec_shapes("resnet50.json", 8 if q else 1),
            torch.float32,
        ),
        "small": ("1000 x 1K", [([1024], True)] * 1000, torch.float32),
        "gpt2-bf16": ("GPT-2 small bf16" + scaled, gpt, torch.bfloat16),
    }
    out = {}
    for k in a.cases:
        m = re.fullmatch(r"(flat|vec)(\d+)(-bf16|-f16)?", k)
        if m:
            dtype = TORCH_DTYPES[m.group(3)[1:]] if m.group(3) else torch.float32
            if m.group(1) == "flat":
                n = int(m.group(2)) - (4 if q else 0)
                label, n = f"flat 2^{n}", 1 << n
            else:
                n = int(m.group(2)) // (16 if q else 1)
                label = f"1 x {n:,}"
            out[k] = (label + (" " + m.group(3)[1:] if m.group(3) else ""), [([n], True)], dtype)
        elif k in cases:
            out[k] = cases[k]
        elif k not in ("startup", "noop"):
            raise SystemExit(f"bench_torch: unknown case {k!r} (see --help)")
    return out


class Entry(benchlib.Entry):
    """A contender with its role in the report ("main", "ceiling", "reference", "overhead",
    "unavailable"), a note, and the seconds its setup took (torch.compile, DeepSpeed's op)."""

    def __init__(self, name, run, before=None, role="main", note="", keep=None):
        super().__init__(name, run, before, keep)
        self.role, self.note = role, note
        self.setup_s = None


def build_entries(a, shapes, dtype, log):
    torch.manual_seed(0)
    decays = [d for _, d in shapes]
    base = [torch.randn(s).mul_(0.02).to(dtype) for s, _ in shapes]
    grads = [[torch.randn(s).mul_(1e-3).to(dtype) for s, _ in shapes] for _ in range(2)]

    def fresh(dt=dtype):
        return [torch.nn.Parameter(b.to(dt, copy=True)) for b in base]

    def rebinder(params, gsets=grads):
        return alternating_grads(params, gsets)

    entries = []
    # optfuse: opt.step() with new gradients and with the same ones, and the C++ step under it.
    ps = fresh()
    opt = oft.AdamW(groups_of(ps, decays), **HP)
    rebinder(ps)()
    opt.step()
    entries.append(Entry("optfuse.torch.AdamW", opt.step, rebinder(ps)))
    if not a.no_overhead:
        entries.append(
            Entry(
                "optfuse C++ set_grads + step", *raw_step(opt, ps, grads), role="overhead", keep=opt
            )
        )
        entries.append(Entry("optfuse opt.step(), same grads", opt.step, role="overhead"))
        entries.append(
            Entry(
                "optfuse C++ step, same grads",
                opt._optfuse_binding.core.step,
                role="overhead",
                keep=opt,
            )
        )
    half = DTYPE_NAMES[dtype] if dtype != torch.float32 else None  # "bf16", "f16"
    if half:  # optfuse with torch's semantics (14 B/element), and (bf16 params) bf16 state
        variants = [
            (
                "optfuse.torch.AdamW(master_weights=False)",
                dict(master_weights=False),
                f"{half} state, no master: torch's semantics and bits",
            )
        ]
        if dtype == torch.bfloat16:  # (f16 params keep f16 state: bf16 state is an error)
            variants.append(
                (
                    "optfuse.torch.AdamW(state_dtype='bf16')",
                    dict(state_dtype="bf16"),
                    "f32 master, bf16 state (20 B/elt)",
                )
            )
        for name, extra, note in variants:
            op = fresh()
            o16 = oft.AdamW(groups_of(op, decays), **HP, **extra)
            rebinder(op)()
            o16.step()
            entries.append(Entry(name, o16.step, rebinder(op), note=note))
    # The 4r3w ceiling in f32 over the same element counts, gradients swapped as above; for
    # 16-bit params also in their dtype with 16-bit state (14 B/element, what torch's semantics
    # move), which is then the ceiling the shares are of.
    cps = fresh(torch.float32)
    cg = [[g.float() for g in gs] for gs in grads] if dtype != torch.float32 else grads
    ceil = oft.Custom(cps, CEILING_RULE)
    rebinder(cps, cg)()
    ceil.step()
    entries.append(
        Entry(
            "ceiling 4r3w (optfuse kernel)",
            *raw_step(ceil, cps, cg),
            role="ceiling" if dtype == torch.float32 else "reference",
            keep=(ceil, cg),
            note="" if dtype == torch.float32 else "f32, 28 B/elt",
        )
    )
    if dtype != torch.float32:
        hps = fresh()
        hceil = oft.Custom(hps, CEILING_RULE, master_weights=False)  # (state in the params' dtype)
        rebinder(hps)()
        hceil.step()
        entries.append(
            Entry(
                "ceiling 4r3w, 16-bit (optfuse kernel)",
                *raw_step(hceil, hps, grads),
                role="ceiling",
                keep=hceil,
                note="14 B/elt: the shares' ceiling",
            )
        )
    # torch.optim.AdamW in each implementation that takes these params: fused, foreach, and
    # the default per-parameter for-loop (foreach=False, fused unset).
    for name, flags in (
        ("torch AdamW fused=True", {"fused": True}),
        ("torch AdamW foreach=True", {"foreach": True}),
        ("torch AdamW foreach=False (for-loop)", {"foreach": False}),
    ):
        tp = fresh()
        t_opt = torch.optim.AdamW(groups_of(tp, decays), **HP, **flags)
        entries.append(
            Entry(
                name,
                t_opt.step,
                rebinder(tp),
                note=f"{half} state, no master" if half else "",
            )
        )
    if dtype != torch.float32:  # torch with an f32 master copy, as AMP-style trainers do it
        tp, masters = fresh(), fresh(torch.float32)
        mg = [torch.empty_like(m) for m in masters]
        for m, g in zip(masters, mg):
            m.grad = g
        m_opt = torch.optim.AdamW(groups_of(masters, decays), **HP, fused=True)

        @torch.no_grad()
        def master_step(tp=tp, masters=masters, mg=mg, m_opt=m_opt):
            torch._foreach_copy_(mg, [p.grad for p in tp])
            m_opt.step()
            torch._foreach_copy_(tp, masters)

        entries.append(
            Entry(
                "torch fused, f32 master + casts",
                master_step,
                rebinder(tp),
                note="+12 B/elt of casts",
            )
        )
    if a.compile_ok and dtype == torch.float32:
        tp = fresh()
        c_opt = torch.optim.AdamW(groups_of(tp, decays), **{**HP, "lr": torch.tensor(HP["lr"])})
        compiled = torch.compile(c_opt.step)
        rebinder(tp)()
        log("  torch.compile: compiling the step ...")
        t0 = time.perf_counter()
        compiled()
        e = Entry("torch.compile(AdamW.step)", compiled, rebinder(tp))
        e.setup_s = time.perf_counter() - t0
        log(f"  torch.compile: first call {e.setup_s:.1f} s")
        entries.append(e)
    if not a.no_deepspeed:
        e = deepspeed_entry(fresh(), decays, rebinder, log)
        entries.append(e)
    return entries


def raw_step(opt, params, gsets):
    """(run, before): the C++ step under optfuse optimizer `opt`, the gradients alternating
    between `gsets` by core.set_grads with addresses computed beforehand: what opt.step() does
    with new gradients, without its Python checks."""
    b = opt._optfuse_binding
    index = {id(p): i for i, p in enumerate(params)}
    ptrs = [
        [(g.cpp, [gs[index[id(p)]].data_ptr() for p in g.params]) for g in b.groups] for gs in gsets
    ]
    turn = [0]

    def before():
        turn[0] ^= 1

    def run(core=b.core):
        for cpp, addresses in ptrs[turn[0]]:
            core.set_grads(cpp, addresses)
        core.step()

    return run, before


_DS = {}


def deepspeed_entry(ps, decays, rebinder, log):
    """DeepSpeedCPUAdam (AdamW mode) when deepspeed imports and its op builds; else a note."""
    try:
        if "cls" not in _DS:
            t0 = time.perf_counter()
            with contextlib.redirect_stdout(io.StringIO()):
                from deepspeed.ops.adam import DeepSpeedCPUAdam

                DeepSpeedCPUAdam([torch.nn.Parameter(torch.zeros(8))])  # builds the op
            _DS.update(cls=DeepSpeedCPUAdam, build=time.perf_counter() - t0)
            log(f"  deepspeed: CPU Adam op ready in {_DS['build']:.1f} s")
        with contextlib.redirect_stdout(io.StringIO()):
            opt = _DS["cls"](groups_of(ps, decays), **HP, adamw_mode=True)
            rebinder(ps)()
            opt.step()
        e = Entry(
            "DeepSpeedCPUAdam",
            opt.step,
            rebinder(ps),
            note=""
            if ps[0].dtype == torch.float32
            else f"f32 state, {DTYPE_NAMES[ps[0].dtype]} params updated directly, no master",
        )
        e.setup_s = _DS["build"]
        return e
    except Exception as ex:  # not installed, op build failed, dtype refused, ...
        msg = f"{type(ex).__name__}: {str(ex).splitlines()[0][:80] if str(ex) else ''}"
        log(f"  deepspeed unavailable: {msg}")
        return Entry("DeepSpeedCPUAdam", None, role="unavailable", note=msg)


# Without --steps, each contender's turn in a round lasts about this long on optfuse's step (and
# at least 3 steps): 3 steps of a 1M-element tensor (0.35 ms) gave shares 0.86-0.98 from one run
# to the next on a noisy 2-core machine, 20 steps 0.93-0.95.
TURN_S = 0.01


def time_case(a, entries, log) -> int:
    """Warms up and times `entries`; returns the timed steps per turn it used."""
    live = [e for e in entries if e.run is not None]
    ours_s = TURN_S / 3  # optfuse's last warm-up step (with --warmup 0, none: 3 steps)
    for e in live:  # warm-up
        for _ in range(a.warmup):
            if e.before:
                e.before()
            t0 = time.perf_counter()
            e.run()
            if e.name == "optfuse.torch.AdamW":
                ours_s = time.perf_counter() - t0
    steps = a.steps
    if steps is None:
        steps = 2 if a.quick else max(3, min(50, math.ceil(TURN_S / max(ours_s, 1e-6))))
    interleaved_rounds(live, a.rounds, steps, a.turn_warmup, log)
    return steps


def summarize(entries, n_elems, n_tensors):
    med = {e.name: statistics.median(e.rounds) for e in entries if e.rounds}
    ceil = next((med[e.name] for e in entries if e.role == "ceiling"), None)
    ours = med.get("optfuse.torch.AdamW")
    rows = []
    for e in entries:
        row = {"name": e.name, "role": e.role, "note": e.note, "setup_s": e.setup_s}
        if e.name in med:
            t = med[e.name]
            row.update(
                ms=t * 1e3,
                min_ms=min(e.rounds) * 1e3,
                rounds_ms=[x * 1e3 for x in e.rounds],
                gbps=28 * n_elems / t / 1e9,
                share=ceil / t if ceil else None,
                x_optfuse=t / ours if ours else None,
            )
        rows.append(row)
    by = {e.name: e for e in entries}
    over = {}
    if "optfuse C++ step, same grads" in by and by["optfuse.torch.AdamW"].rounds:
        for key, py, cpp in (
            ("rebound", "optfuse.torch.AdamW", "optfuse C++ set_grads + step"),
            ("same_grads", "optfuse opt.step(), same grads", "optfuse C++ step, same grads"),
        ):
            d = statistics.median(x - c for x, c in zip(by[py].rounds, by[cpp].rounds))
            over[key + "_ms"] = d * 1e3  # paired by round
            over[key + "_us_per_tensor"] = d * 1e6 / n_tensors
            over[key + "_cpp_ms"] = med[cpp] * 1e3
        over["cpp_share"] = ceil / med["optfuse C++ set_grads + step"] if ceil else None
    torch_rows = [r for r in rows if r["name"].startswith("torch") and "ms" in r]
    best = min(torch_rows, key=lambda r: r["ms"]) if torch_rows else None
    return {
        "rows": rows,
        "overhead": over,
        "best_torch": best and best["name"],
        "optfuse_vs_best_torch": best["ms"] / (ours * 1e3) if best and ours else None,
    }


# ---- start-up, binding overhead ----------------------------------------------------------------
STARTUP = r"""
import json, sys, time, torch
shapes = json.loads(sys.argv[2])
ps = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
for p in ps: p.grad = torch.randn_like(p)
t0 = time.perf_counter()
if sys.argv[1] == "torch":
    t1 = t0
    opt = torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.1, fused=True)
else:
    import optfuse, optfuse.torch as oft
    t1 = time.perf_counter()
    opt = oft.AdamW(ps, lr=1e-3, weight_decay=0.1)
t2 = time.perf_counter()
opt.step()
t3 = time.perf_counter()
c = optfuse.engine().counters() if sys.argv[1] != "torch" else {}
print(json.dumps({"s": t3 - t0, "import_s": t1 - t0, "ctor_s": t2 - t1, "step_s": t3 - t2, **c}))
"""


def startup(a, log, shapes):
    """Import optfuse.torch -> first AdamW step done (torch imported before), fresh processes:
    cold = empty OPTFUSE_CACHE_DIR, warm = the same directory again; and the same for
    torch.optim.AdamW(fused=True) (its constructor imports torch._dynamo the first time)."""
    out = {"cold": [], "warm": [], "torch": []}
    arg = json.dumps([list(s) for s in shapes])
    for i in range(a.startup_runs):
        with tempfile.TemporaryDirectory(prefix="optfuse-bench-cache-") as d:
            env = {**os.environ, "OPTFUSE_CACHE_DIR": d}
            for kind in ("cold", "warm", "torch"):
                p = subprocess.run(
                    [sys.executable, "-c", STARTUP, kind, arg],
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=600,
                )
                if p.returncode:
                    raise RuntimeError(f"start-up subprocess failed: {p.stderr[-500:]}")
                out[kind].append(json.loads(p.stdout.strip().splitlines()[-1]))
        log(
            f"  start-up run {i + 1}: "
            + ", ".join(f"{k} {v[-1]['s']:.3f} s" for k, v in out.items())
        )
    return out


def noop_cost(a):
    """ns per call of optfuse._core.noop(0) (nanobind), and of an empty Python function."""

    def py_noop(x):
        pass

    res = {}
    for name, f in (("optfuse._core.noop", _core.noop), ("python def", py_noop)):
        n, per = 200_000 if not a.quick else 20_000, []
        for _ in range(a.rounds):
            t0 = time.perf_counter()
            for _ in range(n):
                f(0)
            per.append((time.perf_counter() - t0) / n * 1e9)
        res[name] = statistics.median(per)
    return res


def main():
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="smoke test: small sizes (flatN is 2^(N-4), model dims / 8), few rounds",
    )
    ap.add_argument(
        "--cases",
        default="gpt2,resnet50,small,flat20,flat24,gpt2-bf16",
        help="comma list of gpt2, resnet50, small, flatN (one tensor of 2^N, e.g. "
        "flat20), vecN (one tensor of N, e.g. vec1024000), flatN-bf16 / vecN-bf16, flatN-f16 / "
        "vecN-f16, gpt2-bf16, "
        "startup, noop (default: the six cases, then startup and noop)",
    )
    add_timing_args(ap)
    ap.add_argument(
        "--compile",
        default="gpt2,flat20,flat24",
        metavar="CASES",
        help="cases with a torch.compile'd step (default gpt2,flat20,flat24; "
        "GPT-2 compiles ~95 s, 'small' 10+ minutes)",
    )
    ap.add_argument("--no-compile", action="store_true", help="no torch.compile at all")
    ap.add_argument("--no-deepspeed", action="store_true", help="skip DeepSpeedCPUAdam")
    ap.add_argument(
        "--no-overhead",
        action="store_true",
        help="skip the Python-over-C++ step measurements (for size sweeps)",
    )
    ap.add_argument("--startup-runs", type=int, help="cold + warm process pairs (3, quick 1)")
    ap.add_argument("--out-md", metavar="FILE", help="write the Markdown table here too")
    ap.add_argument("--out-json", metavar="FILE", help="all figures, every round, as JSON")
    ap.add_argument("--out-png", metavar="FILE", help="bar chart: share of the ceiling")
    a = ap.parse_args()
    a.rounds = a.rounds or (3 if a.quick else 7)
    a.startup_runs = a.startup_runs or (1 if a.quick else 3)
    asked = a.cases.split(",")
    a.cases = asked + (["startup", "noop"] if a.cases == ap.get_default("cases") else [])
    log = lambda s: print(s, file=sys.stderr, flush=True)
    # A fresh inductor cache, so every torch.compile time is a cold compile (its on-disk cache
    # would make a shape compiled by an earlier run load in a second); kept if set by the user.
    own_cache = "TORCHINDUCTOR_CACHE_DIR" not in os.environ
    if own_cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="bench-torch-inductor-")
    try:
        run_all(a, log)
    finally:
        if own_cache:
            shutil.rmtree(os.environ["TORCHINDUCTOR_CACHE_DIR"], ignore_errors=True)


def run_all(a, log):
    res = {"machine": machine(), "args": vars(a).copy(), "cases": {}}
    for key, (label, shapes, dtype) in make_cases(a).items():
        a.compile_ok = not a.no_compile and key in a.compile.split(",")
        n_elems = sum(torch.Size(s).numel() for s, _ in shapes)
        log(f"{label}: {len(shapes)} tensors, {n_elems / 1e6:.2f} M elements, {dtype}")
        entries = build_entries(a, shapes, dtype, log)
        steps = time_case(a, entries, log)
        res["cases"][key] = {
            "label": label,
            "steps": steps,
            "tensors": len(shapes),
            "elements": n_elems,
            "dtype": str(dtype).replace("torch.", ""),
            **summarize(entries, n_elems, len(shapes)),
        }
        del entries
        torch._dynamo.reset()  # compiled code holds the case's params
        gc.collect()
    if "startup" in a.cases:
        log("start-up (subprocesses) ...")
        try:
            res["startup"] = {
                "16 x 64K": startup(a, log, [(1 << 16,)] * 16),
                "GPT-2 small" + (" (dims / 8)" if a.quick else ""): startup(
                    a, log, [s for s, _ in gpt2_shapes(8 if a.quick else 1)]
                ),
            }
        except (RuntimeError, subprocess.TimeoutExpired, ValueError) as ex:
            log(f"  start-up skipped: {ex}")
    if "noop" in a.cases:
        res["noop"] = noop_cost(a)
    res["engine_counters"] = optfuse.engine().counters()
    res["machine"]["loadavg_end"] = os.getloadavg()[0]
    md = markdown(res)
    print(md)
    if a.out_md:
        Path(a.out_md).write_text(md + "\n")
    if a.out_json:
        Path(a.out_json).write_text(json.dumps(res, indent=1, default=str) + "\n")
    if a.out_png:
        try:
            plot(res, a.out_png)
        except ImportError as ex:
            log(f"no plot: {ex}")


if __name__ == "__main__":
    main()
