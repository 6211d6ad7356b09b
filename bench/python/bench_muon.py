"""optfuse.torch.Muon against torch.optim.Muon on GPT-2 small's hidden matrices, in one process.

Muon is for the 2-D weights of hidden layers: here the 48 matrices of GPT-2 small's 12 blocks
(attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj; 85 M elements; embeddings, biases and norms go
to AdamW in practice and are left out). Contenders take turns round by round
(benchlib.interleaved_rounds):

  torch.optim.Muon        torch's step: lerp_, lerp, the Newton-Schulz iteration, mul_, add_
  optfuse.torch.Muon      two fused kernels per matrix around the Newton-Schulz iteration on
                          torch's ATen ops, with its default ns_products (this machine's: below)
  ... ns_products=bf16    the same with torch's bf16 products (torch's bits)
  Newton-Schulz alone     torch's _zeropower_via_newtonschulz over the same matrices: the part
                          torch and ns_products=bf16 share, so (step - this) is what each spends
                          on the element-wise work

Every matrix's update is a few bf16 matrix products (5 iterations x 3), so the step is bound by
the products, not by memory: the element-wise part optfuse fuses is the small rest. Where torch
has no fast bf16 products (no AVX512-BF16 or AMX), optfuse's default multiplies the same bf16
values in f32 and rounds each product to bf16 once (ns_products="f32"): that is the big ratio.

    ~/.cache/optfuse/venv/bin/python bench/python/bench_muon.py              # GPT-2 small
    ~/.cache/optfuse/venv/bin/python bench/python/bench_muon.py --quick      # dims / 4, 3 rounds
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch
from torch.optim._muon import _zeropower_via_newtonschulz

import optfuse.torch as oft
from benchlib import ROOT, Entry, add_timing_args, interleaved_rounds, machine

HIDDEN = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
KW = dict(lr=0.02, momentum=0.95, weight_decay=0.1)


def hidden_shapes(scale: int):
    """The shapes of the spec's hidden-layer weights, every dim divided by `scale`."""
    spec = json.loads((ROOT / "examples/specs/gpt2-small.json").read_text())
    return [
        [max(1, d // scale) for d in t["shape"]]
        for t in spec["parameters"]
        if t["name"].endswith(tuple(f"{h}.weight" for h in HIDDEN))
    ]


def entries_for(shapes):
    torch.manual_seed(0)
    grads = [torch.randn(s).mul_(1e-3) for s in shapes]
    made, entries = [], []
    for name, cls, kw in (
        ("torch.optim.Muon", torch.optim.Muon, {}),
        ("optfuse.torch.Muon", oft.Muon, {}),
        ("... ns_products=bf16", oft.Muon, dict(ns_products="bf16")),
    ):
        params = [torch.nn.Parameter(torch.randn(s).mul_(0.02)) for s in shapes]
        for p, g in zip(params, grads):
            p.grad = g
        opt = cls(params, **KW, **kw)
        made.append((opt, params))
        entries.append(Entry(name, opt.step))

    def ns_alone():
        for g in grads:
            _zeropower_via_newtonschulz(g, (3.4445, -4.775, 2.0315), 5, 1e-7)

    entries.append(Entry("Newton-Schulz alone", ns_alone))
    return made, entries


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="every dim / 4, 3 rounds of 2 steps")
    ap.add_argument("--json", metavar="FILE", help="every round's figures as JSON")
    add_timing_args(ap)
    a = ap.parse_args()
    rounds = a.rounds or (3 if a.quick else 7)
    steps = a.steps or 2
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    shapes = hidden_shapes(4 if a.quick else 1)
    m = machine()
    n = sum(s[0] * s[1] for s in shapes)
    print(
        f"# Muon on GPT-2 small's {len(shapes)} hidden matrices ({n / 1e6:.1f} M elements"
        f"{', dims / 4: smoke test' if a.quick else ''})\n\nCPU: {m['cpu']}, AVX-512: "
        f"{m['avx512f']}, {m['cores']} cores, torch {m['torch']}, {torch.get_num_threads()} "
        f"threads, load {m['loadavg_start']:.1f}; {rounds} rounds of {steps} steps, medians\n"
    )
    keep, entries = entries_for(shapes)
    print(f"optfuse's default here: ns_products={keep[1][0].defaults['ns_products']!r}\n")
    for e in entries:
        for _ in range(a.warmup):
            e.run()
    interleaved_rounds(entries, rounds, steps, a.turn_warmup, log)
    med = {e.name: statistics.median(e.rounds) for e in entries}
    ns = med["Newton-Schulz alone"]
    print("| contender | step | step - Newton-Schulz | x optfuse |\n|---|---:|---:|---:|")
    ours = med["optfuse.torch.Muon"]
    for e in entries:
        t = med[e.name]
        shared = e.name in ("torch.optim.Muon", "... ns_products=bf16")
        rest = f"{(t - ns) * 1e3:.1f} ms" if shared else "-"
        print(f"| {e.name} | {t * 1e3:.1f} ms | {rest} | {t / ours:.3f} |")
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(
                {"machine": m, "shapes": shapes, "rounds_s": {e.name: e.rounds for e in entries}},
                f,
                indent=1,
            )
    del keep
    return 0


if __name__ == "__main__":
    sys.exit(main())
