#!/usr/bin/env python3
"""The whole AMP optimizer phase of a training step, torch's way against optfuse's, per step.

After `scaler.scale(loss).backward()` a mixed-precision step with gradient clipping runs, in
torch (its fastest CPU configuration):

    scaler.unscale_(opt)                                      # grads *= 1/scale, inf/nan check
    torch.nn.utils.clip_grad_norm_(params, 1.0, foreach=True) # norm pass, then grads *= coef
    scaler.step(opt); scaler.update()                         # AdamW(fused=True), skipped on inf

with `torch.amp.GradScaler("cpu")`, and in optfuse one call, `opt.step()` of
`optfuse.torch.AdamW(..., max_grad_norm=1.0, loss_scale="dynamic")`: a read-only statistics
pass (total norm and non-finite check in one reduction), then the AdamW kernel with the unscale
and clip factor folded into its gradient read. Both scalers start at the same scale (2^16) with
GradScaler's default growth and backoff; the clip norm is active (the gradients' norm is > 1).

Fairness. Every contender has its own params and state; the scaled gradients are one source set
made once (gradients times the initial scale, as backward of the scaled loss gives). Before each
step, untimed, every contender gets NEW gradient tensors cloned from that source (what
zero_grad(set_to_none=True) + backward gives: torch's unscale_ and clip then write fresh
tensors, and optfuse rebinds them as in training), and after the step they are dropped, so only
one contender's gradients are alive at a time. The clone leaves the end of the gradients in the
cache for both alike. The timed region is the phase above, nothing else.

Everything runs in ONE process: per case the contenders take turns within a round (order rotated
each round), --steps timed steps each; each figure is the median over rounds of the round's median
step, as bench_torch.py does.

Bytes model (f32 params and grads, per element):
  torch:   unscale_ reads and writes g (8), clip_grad_norm_ reads g for the norm (4) and reads
           and writes it to scale it (8; torch multiplies even when the factor is 1, to avoid a
           host sync), fused AdamW reads p, g, m, v and writes p, m, v (28)         = 48 B
  optfuse: the statistics pass reads g (4), the update 28                            = 32 B
  the plain AdamW steps (references, no AMP): 28 B; optfuse's statistics pass alone, timed as a
  step skipped for an inf in the last gradient element (a static loss scale: nothing else runs):
  4 B; torch's _foreach_norm over the same gradients (read only, clip_grad_norm_'s first
  pass), 4 B too.
bf16 params and grads (cases "-bf16"): optfuse keeps f32 master weights and f32 state (its
default); torch's best phase that keeps them too runs the f32 phase above over f32 master copies,
with the bf16 gradients cast into the masters' gradients first (2 + 4) and the masters cast to
the bf16 params after (4 + 2): 48 + 12 = 60 B. optfuse: statistics 2 (bf16 gradients read as
they are), update 28 (master, g 2, m, v read; master, m, v, param 2 written) = 30 B. Plain
steps: optfuse 28, torch's fused AdamW with the casts 40. (torch's AdamW(fused=True) on the bf16
params themselves keeps bf16 state and no master copy: a different, less precise update, which
bench_torch.py times.)
The ceiling is optfuse's own 4r3w kernel (p' = p+g, m' = m+g, v' = v+g, f32, as bench_torch.py)
as an optfuse.torch.Custom rule over the same tensors: its GB/s (at 28 B/element) is what this
machine streams. "share" = a contender's GB/s at its own bytes model / the ceiling's: the time of
the ceiling moving the contender's bytes over its time. "x optfuse" = time / optfuse's AMP time.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import statistics
import sys
from pathlib import Path

import torch

import optfuse.torch as oft

from benchlib import (
    CEILING_RULE,
    HP,
    add_timing_args,
    groups_of,
    interleaved_rounds,
    machine,
    spec_shapes,
)

MAX_NORM = 1.0
INIT_SCALE = 2.0**16  # GradScaler's default
SCALER = dict(growth_factor=2.0, backoff_factor=0.5, growth_interval=2000)  # its defaults too
# Bytes per element of each row (the docstring's model) by param / grad dtype.
BYTES = {
    torch.float32: dict(torch=48, optfuse=32, plain=28, stats=4, torch_plain=28),
    torch.bfloat16: dict(torch=60, optfuse=30, plain=28, stats=2, torch_plain=40),
}


# ---- cases -------------------------------------------------------------------------------------
def make_cases(a):
    """The cases named in --cases, in that order: flatN, one tensor of 2^N elements (2^(N-4)
    with --quick); gpt2, the layout of examples/specs/gpt2-small.json (dims / 8 with --quick);
    either with "-bf16": bf16 params and grads instead of f32."""
    out = {}
    for k in a.cases:
        name, bf16, _ = k.partition("-bf16")
        if _ or (bf16 and not k.endswith("-bf16")):
            raise SystemExit(f"bench_amp: unknown case {k!r} (see --help)")
        m = re.fullmatch(r"flat(\d+)", name)
        if m:
            n = int(m.group(1)) - (4 if a.quick else 0)
            label, shapes = f"flat 2^{n}", [([1 << n], True)]
        elif name == "gpt2":
            label = "GPT-2 small" + (" (dims / 8)" if a.quick else "")
            shapes = spec_shapes("gpt2-small.json", 8 if a.quick else 1)
        else:
            raise SystemExit(f"bench_amp: unknown case {k!r} (see --help)")
        out[k] = (label, shapes, torch.bfloat16 if bf16 else torch.float32)
    return out


# ---- contenders --------------------------------------------------------------------------------
class Entry:
    """One timed thing: `run()` is timed; `before()` gives the params new scaled gradients (with
    an inf as the last element when `poison`) and `after()` drops them, both untimed. `bytes`
    per element is its bytes model; `base` names the plain step (no AMP) the phase adds to."""

    def __init__(
        self, name, run, params, source, bytes, role="main", note="", poison=False, base=None
    ):
        self.name, self.run, self.bytes, self.role, self.note = name, run, bytes, role, note
        self.params, self.source, self.poison = params, source, poison
        self.base = base  # the plain step (no AMP) this phase adds to
        self.rounds: list[float] = []  # median step time of each round, seconds

    def before(self):
        for p, s in zip(self.params, self.source):
            p.grad = s.clone()
        if self.poison:
            self.params[-1].grad.view(-1)[-1] = float("inf")

    def after(self):
        for p in self.params:
            p.grad = None


def torch_amp_phase(params, decays, fused):
    """torch's AMP optimizer phase over `params`: unscale_, clip_grad_norm_(foreach), then the
    scaler's step (skipped on inf / nan) and update, with torch.optim.AdamW."""
    opt = torch.optim.AdamW(
        groups_of(params, decays), **HP, **({"fused": True} if fused else {"foreach": True})
    )
    scaler = torch.amp.GradScaler("cpu", init_scale=INIT_SCALE, **SCALER)
    scaler.scale(torch.ones(()))  # makes its scale tensor, as scaling the first loss does

    def phase():
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(params, MAX_NORM, foreach=True)
        scaler.step(opt)
        scaler.update()

    return phase


def with_f32_master(params, make_phase):
    """A phase over f32 master copies of 16-bit `params` (made by `make_phase(masters)`), as a
    torch trainer keeps them: the 16-bit gradients cast into the masters' gradients first, the
    params cast from the masters after."""
    masters = [torch.nn.Parameter(p.detach().float()) for p in params]
    for m in masters:
        m.grad = torch.empty_like(m)
    phase = make_phase(masters)

    @torch.no_grad()
    def run():
        torch._foreach_copy_([m.grad for m in masters], [p.grad for p in params])
        phase()
        torch._foreach_copy_(params, masters)

    return run


def optfuse_amp_phase(params, decays):
    """optfuse's: one step() doing the statistics pass, then the update with unscale and clip."""
    opt = oft.AdamW(
        groups_of(params, decays),
        **HP,
        max_grad_norm=MAX_NORM,
        loss_scale="dynamic",
        init_scale=INIT_SCALE,
        **SCALER,
    )
    return opt.step


def build_entries(a, shapes, dtype):
    """The contenders of a case; 16-bit `dtype` params and grads: optfuse keeps f32 master
    weights (its default), torch runs its f32 phase over master copies with the casts."""
    torch.manual_seed(0)
    decays = [d for _, d in shapes]
    base = [torch.randn(s).mul_(0.02).to(dtype) for s, _ in shapes]
    # The scaled gradients: unscaled ones of std 1e-3 (norm > MAX_NORM: clipping is active),
    # times the scale both scalers start at (a power of two: unscaling them is exact).
    source = [torch.randn(s).mul_(1e-3 * INIT_SCALE).to(dtype) for s, _ in shapes]
    unscaled = [s / INIT_SCALE for s in source]
    b = BYTES[dtype]

    def fresh(dt=dtype):
        return [torch.nn.Parameter(x.to(dt, copy=True)) for x in base]

    def torch_phase(ps, fused):
        if dtype == torch.float32:
            return torch_amp_phase(ps, decays, fused)
        return with_f32_master(ps, lambda ms: torch_amp_phase(ms, decays, fused))

    master = "" if dtype == torch.float32 else ", f32 master + casts"
    entries = []
    ps = fresh()
    entries.append(
        Entry(
            "optfuse AdamW(max_grad_norm, loss_scale)",
            optfuse_amp_phase(ps, decays),
            ps,
            source,
            b["optfuse"],
            note="statistics pass + update",
            base="optfuse AdamW alone (no AMP)",
        )
    )
    ps = fresh()
    entries.append(
        Entry(
            "torch GradScaler + clip(foreach) + AdamW(fused)" + master,
            torch_phase(ps, True),
            ps,
            source,
            b["torch"],
            note="unscale_, clip_grad_norm_, scaler.step, update",
            base="torch AdamW(fused) alone (no AMP)" + master,
        )
    )
    if not a.no_foreach:
        ps = fresh()
        entries.append(
            Entry(
                "torch GradScaler + clip(foreach) + AdamW(foreach)" + master,
                torch_phase(ps, False),
                ps,
                source,
                b["torch"],
            )
        )
    if not a.no_references:  # the update alone, no AMP: what the phase adds to it
        ps = fresh()
        entries.append(
            Entry(
                "optfuse AdamW alone (no AMP)",
                oft.AdamW(groups_of(ps, decays), **HP).step,
                ps,
                unscaled,
                b["plain"],
                role="reference",
            )
        )
        ps = fresh()  # static scale: a non-finite gradient skips the step, the scale stays
        entries.append(
            Entry(
                "optfuse statistics pass alone (skipped step)",
                oft.AdamW(
                    groups_of(ps, decays), **HP, max_grad_norm=MAX_NORM, loss_scale=INIT_SCALE
                ).step,
                ps,
                source,
                b["stats"],
                role="reference",
                note="an inf in the last element",
                poison=True,
            )
        )
        ps = fresh()
        entries.append(
            Entry(
                "torch _foreach_norm of the gradients",
                lambda ps=ps: torch._foreach_norm([p.grad for p in ps]),
                ps,
                source,
                b["stats"],
                role="reference",
                note="a read-only pass, as the statistics",
            )
        )
        ps = fresh()
        plain = torch.optim.AdamW(groups_of(ps, decays), **HP, fused=True).step
        if dtype != torch.float32:
            plain = with_f32_master(
                ps, lambda ms: torch.optim.AdamW(groups_of(ms, decays), **HP, fused=True).step
            )
        entries.append(
            Entry(
                "torch AdamW(fused) alone (no AMP)" + master,
                plain,
                ps,
                unscaled,
                b["torch_plain"],
                role="reference",
            )
        )
    ps = fresh(torch.float32)  # (f32 whatever the case's dtype, as bench_torch.py)
    entries.append(
        Entry(
            "ceiling 4r3w (optfuse kernel)",
            oft.Custom(ps, CEILING_RULE).step,
            ps,
            [u.float() for u in unscaled],
            28,
            role="ceiling",
        )
    )
    return entries


# ---- timing ------------------------------------------------------------------------------------
def time_case(a, entries, log):
    for e in entries:  # warm-up: kernels compiled or loaded, state made
        for _ in range(a.warmup):
            e.before()
            e.run()
            e.after()
    interleaved_rounds(entries, a.rounds, a.steps, a.turn_warmup, log)


def summarize(entries, n_elems):
    med = {e.name: statistics.median(e.rounds) for e in entries}
    ceil = next(e for e in entries if e.role == "ceiling")
    ceil_gbps = ceil.bytes * n_elems / med[ceil.name] / 1e9
    ours = med[entries[0].name]
    rows = []
    for e in entries:
        t = med[e.name]
        gbps = e.bytes * n_elems / t / 1e9
        rows.append(
            {
                "name": e.name,
                "role": e.role,
                "note": e.note,
                "bytes": e.bytes,
                "ms": t * 1e3,
                "min_ms": min(e.rounds) * 1e3,
                "rounds_ms": [x * 1e3 for x in e.rounds],
                "gbps": gbps,
                "share": gbps / ceil_gbps,
                "x_optfuse": t / ours,
            }
        )
    torch_amp = [r for r in rows if r["name"].startswith("torch GradScaler")]
    best = min(torch_amp, key=lambda r: r["ms"])
    out = {"rows": rows, "best_torch": best["name"], "speedup": best["ms"] / (ours * 1e3)}
    by = {e.name: e for e in entries}
    # What each AMP phase adds to its plain step: the median over rounds of the difference
    # within each round (the two ran minutes apart at most).
    out["added_ms"] = {
        e.name: statistics.median(x - y for x, y in zip(e.rounds, by[e.base].rounds)) * 1e3
        for e in entries
        if e.base in by
    }
    return out


# ---- output ------------------------------------------------------------------------------------
def markdown(res):
    m, a = res["machine"], res["args"]
    smoke = " — smoke test" if a["quick"] else ""
    L = [
        f"# The AMP optimizer phase: torch against optfuse{smoke}",
        "",
        f"CPU: {m['cpu']} ({m['cores']} cores, avx512f: {'yes' if m['avx512f'] else 'no'}); "
        f"torch {m['torch']} ({m['torch_threads']} threads); optfuse {m['optfuse']} "
        f"({m['optfuse_threads']} threads); Python {m['python']}. Load average (1 min) at "
        f"start / end: {m['loadavg_start']:.1f} / {m['loadavg_end']:.1f}.",
        f"{a['rounds']} interleaved rounds x {a['steps']} steps (+{a['turn_warmup']} untimed per "
        "turn), median of round medians; new scaled gradients before every step (untimed). "
        "AdamW (lr 6e-4, weight decay 0.1 / 0 as gpt2-small.json), clip norm 1.0, dynamic loss "
        "scale from 2^16. GB/s at each row's bytes model (B/elt); share = GB/s / the 4r3w "
        "ceiling's; x optfuse = time / optfuse's AMP time (> 1: optfuse is faster).",
        "",
    ]
    for c in res["cases"].values():
        L += [
            f"## {c['label']}: {c['tensors']} tensors, {c['elements'] / 1e6:.2f} M elements "
            f"({c['dtype']})",
            "",
            "| contender | ms / step | min | B/elt | GB/s | share | x optfuse | note |",
            "|---|---:|---:|---:|---:|---:|---:|---|",
        ]
        for r in c["rows"]:
            L.append(
                f"| {r['name']} | {r['ms']:.3f} | {r['min_ms']:.3f} | {r['bytes']} | "
                f"{r['gbps']:.1f} | {r['share']:.2f} | {r['x_optfuse']:.2f} | {r['note']} |"
            )
        L += [
            "",
            f"optfuse's AMP phase against the best torch one ({c['best_torch']}): "
            f"**{c['speedup']:.2f}x** (< 1: torch is faster).",
        ]
        added = c.get("added_ms", {})
        if added:
            L.append(
                "What each phase adds to its plain AdamW step (paired per round): "
                + ", ".join(f"{name.split(' ')[0]} {ms:+.3f} ms" for name, ms in added.items())
                + "."
            )
        L.append("")
    return "\n".join(L)


def main():
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    ap.add_argument(
        "--quick",
        action="store_true",
        help="smoke test: small sizes (flatN is 2^(N-4), GPT-2 dims / 8), few rounds",
    )
    ap.add_argument(
        "--cases",
        default="flat24,gpt2",
        help="comma list of flatN (one tensor of 2^N, e.g. flat24) and gpt2, each "
        "optionally with -bf16 (bf16 params and grads, e.g. gpt2-bf16; default "
        "flat24,gpt2)",
    )
    add_timing_args(ap)
    ap.add_argument(
        "--no-foreach", action="store_true", help="skip torch's AMP phase with AdamW(foreach=True)"
    )
    ap.add_argument(
        "--no-references",
        action="store_true",
        help="skip the reference rows: the plain AdamW steps (no AMP), optfuse's "
        "statistics pass alone, torch's _foreach_norm",
    )
    ap.add_argument("--out-md", metavar="FILE", help="write the Markdown table here too")
    ap.add_argument("--out-json", metavar="FILE", help="all figures, every round, as JSON")
    a = ap.parse_args()
    a.rounds = a.rounds or (3 if a.quick else 7)
    a.steps = a.steps or (2 if a.quick else 3)
    a.cases = a.cases.split(",")
    log = lambda s: print(s, file=sys.stderr, flush=True)
    res = {"machine": machine(), "args": vars(a).copy(), "cases": {}}
    for key, (label, shapes, dtype) in make_cases(a).items():
        n_elems = sum(torch.Size(s).numel() for s, _ in shapes)
        log(f"{label}: {len(shapes)} tensors, {n_elems / 1e6:.2f} M elements")
        entries = build_entries(a, shapes, dtype)
        time_case(a, entries, log)
        res["cases"][key] = {
            "label": label,
            "tensors": len(shapes),
            "elements": n_elems,
            "dtype": str(dtype).replace("torch.", ""),
            **summarize(entries, n_elems),
        }
        del entries
        gc.collect()
    res["machine"]["loadavg_end"] = os.getloadavg()[0]
    md = markdown(res)
    print(md)
    if a.out_md:
        Path(a.out_md).write_text(md + "\n")
    if a.out_json:
        Path(a.out_json).write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
