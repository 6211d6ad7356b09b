#!/usr/bin/env python3
"""A captured rule (optfuse.torch.rule / from_rule) on GPT-2 small: capture + compile time, cold
and warm, against torch.compile of the same function's step; and its step against the library's
hand-built AdamW kernel, the same function run eagerly by torch, and the torch.compile'd step.

The rule is AdamW written in PyTorch as torch.optim writes it (in place, with torch's maximize),
so it is the same maths as oft.AdamW: the captured rule must reach the same kernel, and its step
differs from the library's only by the Python of the step.

Capture + compile: fresh processes (torch imported, the model's params and gradients made first,
not counted), each timing the trace, from_rule's constructor and the binding of the C++
optimizer (where its kernels are compiled, or loaded from the cache), with the state tensors made
beforehand (every optimizer's first step makes them: not counted); then two steps, reported
apart. cold = an empty OPTFUSE_CACHE_DIR, warm = the same directory again; medians over
--startup-runs pairs. torch.compile: the first call of the
compiled step in this process (dynamo + inductor: the compile, with an empty inductor cache),
scalars as 0-dim tensors (so a changed lr does not recompile there either).

Steps: ONE process; every contender has its own params and state (two gradient sets shared,
swapped before each step as zero_grad(set_to_none=True) + backward would); contenders take turns
within a round, the order rotated each round; each figure is the median over rounds of the
round's median step.
"""

from __future__ import annotations

import argparse
import json
import os
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
from benchlib import Entry, alternating_grads, groups_of, interleaved_rounds, spec_shapes

HP = dict(lr=6e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, maximize=False)  # gpt2-small


def adamw(p, grad, exp_avg, exp_avg_sq, *, lr, betas, eps, weight_decay, maximize, step):
    """AdamW as torch.optim's single-tensor loop writes it."""
    beta1, beta2 = betas
    grad = torch.where(maximize, -grad, grad)
    p.mul_(1 - lr * weight_decay)
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    bias_correction1 = 1 - beta1**step
    bias_correction2 = 1 - beta2**step
    denom = (exp_avg_sq.sqrt() / bias_correction2.sqrt()).add_(eps)
    p.addcdiv_(exp_avg, denom, value=-lr / bias_correction1)


# ---- capture + compile, in fresh processes -----------------------------------------------------
STARTUP = r"""
import json, sys, time
import torch
shapes = json.loads(sys.argv[1])
ps = [torch.nn.Parameter(torch.zeros(s)) for s, _ in shapes]
for p in ps:
    p.grad = torch.zeros_like(p)
t0 = time.perf_counter()
import optfuse.torch as oft
sys.path.insert(0, sys.argv[2])
from bench_capture import HP, adamw, groups_of
t1 = time.perf_counter()
rule = oft.rule(adamw)
rule.to_json(HP)
t2 = time.perf_counter()
opt = oft.from_rule(rule, groups_of(ps, [d for _, d in shapes]), HP)
t3 = time.perf_counter()
for p in ps:  # the state every optimizer makes (1 GB here): not the capture's
    opt.state[p]["exp_avg"] = torch.zeros_like(p)
    opt.state[p]["exp_avg_sq"] = torch.zeros_like(p)
    opt.state[p]["step"] = torch.tensor(0.0)
t4 = time.perf_counter()
with torch.no_grad():
    opt._optfuse_bind()  # the C++ optimizer: its kernels compiled or loaded
t5 = time.perf_counter()
opt.step()
t6 = time.perf_counter()
opt.step()
t7 = time.perf_counter()
import optfuse
c = optfuse.engine().counters()
keys = sorted({u["key"] for u in opt._optfuse_binding.core.kernel_uses()})
print(json.dumps({"import_s": t1 - t0, "trace_s": t2 - t1, "ctor_s": t3 - t2,
                  "bind_s": t5 - t4, "capture_compile_s": (t3 - t1) + (t5 - t4),
                  "first_step_s": t6 - t5, "step_s": t7 - t6,
                  "compiles": c["compiles"], "disk_hits": c["disk_hits"],
                  "compile_s": c["compile_seconds"], "keys": keys}))
"""


def startup(a, shapes, log):
    out = {"cold": [], "warm": []}
    arg = json.dumps([[list(s), d] for s, d in shapes])
    for i in range(a.startup_runs):
        with tempfile.TemporaryDirectory(prefix="optfuse-capture-cache-") as d:
            env = {**os.environ, "OPTFUSE_CACHE_DIR": d}
            for kind in ("cold", "warm"):
                p = subprocess.run(
                    [sys.executable, "-c", STARTUP, arg, str(Path(__file__).parent)],
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=900,
                )
                if p.returncode:
                    raise RuntimeError(f"capture subprocess failed: {p.stderr[-800:]}")
                out[kind].append(json.loads(p.stdout.strip().splitlines()[-1]))
        log(
            f"  run {i + 1}: cold {out['cold'][-1]['capture_compile_s']:.3f} s, "
            f"warm {out['warm'][-1]['capture_compile_s']:.3f} s"
        )
    return out


# ---- steps, one process ------------------------------------------------------------------------
def scalar_tensors(hp, decays_value):
    t = lambda v: torch.tensor(v, dtype=torch.float32)
    return {
        "lr": t(hp["lr"]),
        "betas": (t(hp["betas"][0]), t(hp["betas"][1])),
        "eps": t(hp["eps"]),
        "weight_decay": t(decays_value),
        "maximize": torch.tensor(hp["maximize"]),
    }


def build(a, shapes, log):
    torch.manual_seed(0)
    decays = [d for _, d in shapes]
    base = [torch.randn(s).mul_(0.02) for s, _ in shapes]
    grads = [[torch.randn(s).mul_(1e-3) for s, _ in shapes] for _ in range(2)]

    def fresh():
        return [torch.nn.Parameter(b.clone()) for b in base]

    entries, info = [], {}
    ps = fresh()
    cap = oft.from_rule(adamw, groups_of(ps, decays), HP)
    alternating_grads(ps, grads)()
    cap.step()
    entries.append(Entry("captured rule (from_rule)", cap.step, alternating_grads(ps, grads)))
    ps = fresh()
    lib = oft.AdamW(groups_of(ps, decays), **{k: v for k, v in HP.items() if k != "maximize"})
    alternating_grads(ps, grads)()
    lib.step()
    entries.append(Entry("library oft.AdamW", lib.step, alternating_grads(ps, grads)))
    key = lambda o: sorted({u["key"] for u in o._optfuse_binding.core.kernel_uses()})
    info["same_kernel"] = key(cap) == key(lib)
    info["keys"] = key(cap)

    def eager_step(params, states, scal):
        @torch.no_grad()
        def step():
            for p, st, d in zip(params, states, decays):
                st["step"] += 1
                adamw(p, p.grad, st["exp_avg"], st["exp_avg_sq"], **scal[d], step=st["step"])

        return step

    def state_for(params):
        return [
            {
                "exp_avg": torch.zeros_like(p),
                "exp_avg_sq": torch.zeros_like(p),
                "step": torch.tensor(0.0),
            }
            for p in params
        ]

    scal = {True: scalar_tensors(HP, HP["weight_decay"]), False: scalar_tensors(HP, 0.0)}
    ps = fresh()
    entries.append(
        Entry(
            "same function, eager torch",
            eager_step(ps, state_for(ps), scal),
            alternating_grads(ps, grads),
        )
    )
    if not a.no_compile:
        ps = fresh()
        compiled = torch.compile(eager_step(ps, state_for(ps), scal))
        alternating_grads(ps, grads)()
        log("  torch.compile: compiling the step ...")
        t0 = time.perf_counter()
        compiled()
        info["torch_compile_s"] = time.perf_counter() - t0
        log(f"  torch.compile: first call {info['torch_compile_s']:.1f} s")
        entries.append(
            Entry("same function, torch.compile", compiled, alternating_grads(ps, grads))
        )
    return entries, info


def time_steps(a, entries, log):
    for e in entries:
        for _ in range(a.warmup):
            e.before()
            e.run()
    interleaved_rounds(entries, a.rounds, a.steps, 1, log)
    return (
        {e.name: statistics.median(e.rounds) for e in entries},
        {e.name: e.rounds for e in entries},
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", type=int, default=1, help="divide every GPT-2 dim by this (1)")
    ap.add_argument("--rounds", type=int, default=7, help="interleaved rounds (7)")
    ap.add_argument("--steps", type=int, default=3, help="timed steps per round (3)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first (2)")
    ap.add_argument("--startup-runs", type=int, default=3, help="cold + warm pairs (3)")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--skip-steps", action="store_true", help="capture + compile figures only")
    ap.add_argument("--out-json", metavar="FILE", help="every figure as JSON")
    a = ap.parse_args()
    log = lambda s: print(s, file=sys.stderr, flush=True)
    # A cold torch.compile: its own inductor cache, removed at exit (unless one is set).
    own_cache = "TORCHINDUCTOR_CACHE_DIR" not in os.environ
    if own_cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="bench-capture-inductor-")
    try:
        run(a, log)
    finally:
        if own_cache:
            shutil.rmtree(os.environ["TORCHINDUCTOR_CACHE_DIR"], ignore_errors=True)


def run(a, log):
    shapes = spec_shapes("gpt2-small.json", a.scale)
    n = sum(torch.Size(s).numel() for s, _ in shapes)
    log(
        f"GPT-2 small / {a.scale}: {len(shapes)} tensors, {n / 1e6:.1f} M elements; "
        f"load {os.getloadavg()[0]:.2f}"
    )
    log("capture + compile (fresh processes):")
    st = startup(a, shapes, log)
    entries, info, med, rounds = [], {}, {}, {}
    if not a.skip_steps:
        log("steps (one process):")
        entries, info = build(a, shapes, log)
        med, rounds = time_steps(a, entries, log)
    res = {
        "elements": n,
        "tensors": len(shapes),
        "startup": st,
        "steps_s": med,
        "rounds_s": rounds,
        **info,
        "torch": torch.__version__,
        "optfuse": optfuse.__version__,
        "load_end": os.getloadavg()[0],
    }
    m = lambda kind, k: statistics.median(r[k] for r in st[kind])
    print(
        f"GPT-2 small{'' if a.scale == 1 else f' / {a.scale}'}: {len(shapes)} tensors, "
        f"{n / 1e6:.1f} M elements"
    )
    print(
        "capture + compile (trace + from_rule + binding: kernels compiled or loaded), median "
        f"of {a.startup_runs} fresh processes:"
    )
    for kind in ("cold", "warm"):
        print(
            f"  {kind:5s} {m(kind, 'capture_compile_s') * 1e3:8.1f} ms  (trace "
            f"{m(kind, 'trace_s') * 1e3:.1f} ms, from_rule {m(kind, 'ctor_s') * 1e3:.1f} ms, "
            f"binding {m(kind, 'bind_s') * 1e3:.1f} ms; compiles {st[kind][0]['compiles']}, "
            f"disk hits {st[kind][0]['disk_hits']}, compiling "
            f"{m(kind, 'compile_s') * 1e3:.1f} ms; then steps "
            f"{m(kind, 'first_step_s') * 1e3:.1f}, {m(kind, 'step_s') * 1e3:.1f} ms)"
        )
    if "torch_compile_s" in info:
        print(f"  torch.compile of the same step: first call {info['torch_compile_s']:.1f} s")
    if a.out_json:
        Path(a.out_json).write_text(json.dumps(res, indent=1))
    if a.skip_steps:
        return
    cap, lib = med["captured rule (from_rule)"], med["library oft.AdamW"]
    print(f"same kernel as oft.AdamW: {info['same_kernel']} ({', '.join(info['keys'])})")
    print(f"step, median of {a.rounds} rounds x {a.steps} steps:")
    for name, t in med.items():
        print(f"  {name:32s} {t * 1e3:9.2f} ms   x captured {t / cap:5.2f}")
    # The same round's two medians, a minute apart at most: less exposed to the load drifting.
    paired = statistics.median(
        c / l for c, l in zip(rounds["captured rule (from_rule)"], rounds["library oft.AdamW"])
    )
    print(
        f"captured / library: {cap / lib:.3f} (medians), {paired:.3f} (median of the rounds' "
        "ratios)"
    )


if __name__ == "__main__":
    main()
