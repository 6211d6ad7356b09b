#!/usr/bin/env python3
"""Which 8-bit code maps can hold AdamW's state: a training study (issue 17, item 1).

Trains the same models from the same seed with AdamW whose two moments are stored in different
ways, and reports how far each run's loss drifts from the run with f32 state. The stored forms:

- ``f32``: torch.optim.AdamW (foreach), the reference.
- ``bf16``: optfuse.torch.AdamW(state_dtype="bf16"), round-to-nearest-even after every step.
- ``int8 (optfuse ...)``: optfuse.torch.AdamW(state_dtype="int8"), the built kernels with the
  maps chosen here (linear m, sqrt v), for every tensor and with the default min_8bit_size.
- ``int8 <m map>/<v map>``: block-wise quantized state, simulated here in PyTorch: each step
  dequantizes both moments, runs torch's AdamW formulas in f32, then requantizes them, one f32
  scale (the block's absmax) per block of ``--block`` elements, codes by nearest value in the map.
  Maps: ``linear`` (256 evenly spaced codes, signed for m and unsigned for v), ``dynamic``
  (Dettmers' dynamic tree map, signed for m, unsigned for v; built by our own
  ``dynamic_map`` below), and ``sqrt`` for v only (codes linear in sqrt(v / absmax)).
- ``torchao AdamW8bit`` and ``bitsandbytes AdamW8bit``, when those packages import (both run on
  CPU; neither is needed by optfuse). Both quantize only tensors of >= 4096 elements; the
  simulated runs quantize every tensor, which is the harder test.

The models are the test suite's two (tests/python/test_models.py), widened so that their weight
matrices hold thousands of elements: an MLP on a smooth target and a 2-layer transformer that
learns to copy the previous token, 300 steps of cosine-scheduled AdamW with weight decay.

Figures: final loss (mean of the last 20 steps), the median and the largest per-step relative
loss difference against the f32 run, and the relative L2 distance of the final params.
Run: ``python bench/python/study_int8_state.py [--steps 300] [--block 256] [--out PATH]``.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

import torch
import torch.nn as nn


# ---- code maps ---------------------------------------------------------------------------------
def dynamic_map(signed: bool) -> torch.Tensor:
    """Dettmers' dynamic tree map (arXiv 1511.04561; bitsandbytes' and torchao's 8-bit
    optimizers use it): 256 sorted values in [-1, 1] (signed) or [0, 1]. A value is 10^(i-6)
    times a linear fraction in [0.1, 1], with 2^i fraction steps at exponent i (2^(i+1) unsigned,
    which has no sign bit to pay for), so small magnitudes keep their relative precision."""
    max_exp = 7
    values = [0.0, 1.0]
    for i in range(max_exp):
        n = 2**i if signed else 2 ** (i + 1)
        bounds = torch.linspace(0.1, 1, n + 1, dtype=torch.float64)
        means = (bounds[:-1] + bounds[1:]) / 2 * 10.0 ** (i - (max_exp - 1))
        values += means.tolist()
        if signed:
            values += (-means).tolist()
    assert len(values) == 256
    return torch.tensor(sorted(values), dtype=torch.float32)


def linear_map(signed: bool) -> torch.Tensor:
    if signed:
        return torch.cat([torch.linspace(-1, 1, 255), torch.tensor([1.0])]).sort().values
    return torch.linspace(0, 1, 256)


def sqrt_map() -> torch.Tensor:
    return torch.linspace(0, 1, 256) ** 2  # v / absmax = (code / 255)^2


MAPS = {"linear": linear_map, "dynamic": dynamic_map}


def quantize(x: torch.Tensor, qmap: torch.Tensor, block: int):
    """(codes, scales) of flat `x`, padded to whole blocks: nearest map value of x / absmax."""
    n = x.numel()
    pad = (-n) % block
    xb = torch.nn.functional.pad(x.reshape(-1), (0, pad)).view(-1, block)
    scale = xb.abs().amax(1, keepdim=True).clamp_min(1e-30)
    normed = (xb / scale).reshape(-1)
    hi = torch.searchsorted(qmap, normed).clamp(1, qmap.numel() - 1)
    lo = hi - 1
    codes = torch.where((normed - qmap[lo]).abs() <= (qmap[hi] - normed).abs(), lo, hi)
    return codes.to(torch.uint8), scale


def dequantize(codes, scale, qmap, n, shape):
    return (qmap[codes.long()].view(scale.shape[0], -1) * scale).reshape(-1)[:n].view(shape)


class SimulatedAdamW8bit(torch.optim.Optimizer):
    """torch.optim.AdamW's single-tensor formulas, with exp_avg and exp_avg_sq kept as codes and
    block scales between steps (see the module docstring)."""

    def __init__(
        self,
        params,
        m_map,
        v_map,
        block=256,
        lr=1e-3,
        betas=(0.9, 0.999),
        eps=1e-8,
        weight_decay=1e-2,
    ):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.m_map, self.v_map, self.block = m_map, v_map, block

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                if not st:
                    st["step"] = 0
                    m = torch.zeros_like(p)
                    v = torch.zeros_like(p)
                else:
                    m = dequantize(*st["m"], self.m_map, p.numel(), p.shape)
                    v = dequantize(*st["v"], self.v_map, p.numel(), p.shape)
                st["step"] += 1
                t = st["step"]
                p.mul_(1 - group["lr"] * group["weight_decay"])
                m.lerp_(p.grad, 1 - b1)
                v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                denom = (v.sqrt() / math.sqrt(1 - b2**t)).add_(group["eps"])
                p.addcdiv_(m, denom, value=-group["lr"] / (1 - b1**t))
                st["m"] = quantize(m, self.m_map, self.block)
                st["v"] = quantize(v, self.v_map, self.block)


# ---- models (tests/python/test_models.py, widened) ---------------------------------------------
class TinyTransformer(nn.Module):
    def __init__(self, vocab=64, dim=128, heads=4, layers=2, seq=16):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(seq, dim))
        layer = nn.TransformerEncoderLayer(dim, heads, 256, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, vocab)

    def forward(self, x):
        return self.head(self.enc(self.emb(x) + self.pos))


def make(kind):
    g = torch.Generator().manual_seed(1)
    if kind == "mlp":
        model = nn.Sequential(
            nn.Linear(20, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 1)
        )
        x = torch.randn(256, 20, generator=g)
        y = (x[:, :5].sum(1, keepdim=True) ** 2 + x[:, 5:6]).tanh()
        return model, x, y, nn.functional.mse_loss
    model = TinyTransformer()
    x = torch.randint(0, 64, (64, 16), generator=g)
    y = torch.roll(x, 1, dims=1)
    return (
        model,
        x,
        y,
        lambda out, tgt: nn.functional.cross_entropy(out.reshape(-1, 64), tgt.reshape(-1)),
    )


def train(kind, make_opt, steps):
    torch.manual_seed(0)
    model, x, y, loss_fn = make(kind)
    opt = make_opt(model.parameters())
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    losses = []
    for _ in range(steps):
        loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
    return losses, torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def contenders(block):
    hp = dict(lr=3e-3, weight_decay=0.1)
    out = {"f32": lambda ps: torch.optim.AdamW(ps, foreach=True, **hp)}
    try:
        import optfuse.torch as oft

        out["bf16 (optfuse state_dtype='bf16')"] = lambda ps: oft.AdamW(
            ps, state_dtype="bf16", **hp
        )
        # The built kernels (linear m, sqrt v): every tensor, as the simulated runs, and with
        # the default min_8bit_size (tensors below 4096 elements keep f32 state).
        out["int8 (optfuse state_dtype='int8', every tensor)"] = lambda ps: oft.AdamW(
            ps, state_dtype="int8", block_size=block, min_8bit_size=0, **hp
        )
        out["int8 (optfuse state_dtype='int8', min_8bit_size 4096)"] = lambda ps: oft.AdamW(
            ps, state_dtype="int8", block_size=block, **hp
        )
    except ImportError:
        pass
    for m_name, v_name in [
        ("linear", "linear"),
        ("dynamic", "linear"),
        ("dynamic", "dynamic"),
        ("dynamic", "sqrt"),
        ("linear", "dynamic"),
        ("linear", "sqrt"),
    ]:
        m_map = MAPS[m_name](True)
        v_map = sqrt_map() if v_name == "sqrt" else MAPS[v_name](False)
        out[f"int8 {m_name}/{v_name} (simulated)"] = lambda ps, a=m_map, b=v_map: (
            SimulatedAdamW8bit(ps, a, b, block, **hp)
        )
    try:
        from torchao.optim import AdamW8bit as TaoAdamW8bit

        out["torchao AdamW8bit"] = lambda ps: TaoAdamW8bit(ps, block_size=block, **hp)
    except Exception:
        pass
    try:
        import bitsandbytes as bnb

        out["bitsandbytes AdamW8bit"] = lambda ps: bnb.optim.AdamW8bit(ps, **hp)
    except Exception:
        pass
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--block", type=int, default=256, help="elements per quantization block")
    ap.add_argument("--models", default="mlp,transformer")
    ap.add_argument("--out", help="also write the Markdown tables here")
    a = ap.parse_args()
    torch.set_num_threads(1)  # deterministic forward and backward in every run
    lines = [
        f"# 8-bit AdamW state: loss drift against f32 state ({a.steps} steps, block {a.block})",
        "",
    ]
    for kind in a.models.split(","):
        runs = {}
        for name, make_opt in contenders(a.block).items():
            t0 = time.time()
            runs[name] = train(kind, make_opt, a.steps)
            print(f"{kind}: {name} done in {time.time() - t0:.1f} s", flush=True)
        ref_loss, ref_p = runs["f32"]
        lines += [
            f"## {kind}",
            "",
            "| state | final loss | median step drift | max step drift | param distance |",
            "|---|---:|---:|---:|---:|",
        ]
        for name, (loss, p) in runs.items():
            drift = [abs(x - r) / max(abs(r), 1e-12) for x, r in zip(loss, ref_loss)]
            final = statistics.mean(loss[-20:])
            dist = ((p - ref_p).norm() / ref_p.norm()).item()
            lines.append(
                f"| {name} | {final:.4g} | {statistics.median(drift):.2e} | "
                f"{max(drift):.2e} | {dist:.2e} |"
            )
        lines.append("")
    text = "\n".join(lines)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
