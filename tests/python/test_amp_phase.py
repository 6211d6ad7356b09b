"""The AMP optimizer phase, torch's way against optfuse's, step for step.

torch: `GradScaler("cpu")`, then per step `scaler.unscale_(opt)`, `clip_grad_norm_(params,
max_norm, foreach=True)`, `scaler.step(opt)`, `scaler.update()` with `AdamW(fused=True)` (the
configuration bench/python/bench_amp.py times). optfuse: `oft.AdamW(..., max_grad_norm=max_norm,
loss_scale="dynamic")` and one `step()` on the same scaled gradients. (test_features.py checks
optfuse under torch's GradScaler, and one skipped step of its own scaler; this file checks its
own scaler against torch's over whole runs.)

What must match, and the tolerances:
- every skip decision, step for step, and the loss scale sequence (before and after each step):
  exactly. Both look for inf / nan in the scaled gradients, and both scales are float32 powers
  of two moved by the same rule.
- the total norm of applied steps: relative 1e-5. torch sums the squares of the unscaled
  gradients in float32, optfuse those of the scaled ones in float64 and divides by the scale
  (a power of two: exact). So beyond the runs' own drift (each run's gradients depend on its
  params) only torch's float32 rounding of a ~30K-term sum differs: measured within 2.7e-7;
  1e-5 is the bound of test_features.py's clipping test. A non-finite norm: the same inf or nan.
- the clip coefficient: min(max_norm / (norm + 1e-6), 1) in both, so the same relative 1e-5;
  exactly 1 in both where the norm is below max_norm (the gradient amplitudes keep every norm
  at least 25% away from it).
- the params after the run: 2e-5 absolute (|p| ~ 1), the float32 bound of test_trajectories.py
  for AdamW at lr 1e-2: the gradients differ by the clip coefficients' last bits, which Adam's
  normalized update turns into far less than the rounding of the update itself (measured:
  1.9e-6 after 30 steps).
"""

import math

import pytest
import torch

import optfuse.torch as oft
from conftest import grad_for, make_params, max_abs

MAX_NORM = 1.0
# Gradient amplitude per step (cycled): the norms of make_params()'s gradients are ~176 x this,
# so about 0.7, 1.3 and 2.6: some steps clip, some do not.
AMPLITUDES = (0.004, 0.0075, 0.015)
# step -> [(tensor, flat index, value)] written into the scaled gradients: lone and consecutive
# skips, inf and nan, in a one-element tensor, and both kinds at once.
NONFINITE = {
    4: [(0, 7, math.inf)],
    9: [(2, 0, math.nan)],
    10: [(5, 20199, -math.inf)],
    17: [(3, 0, math.inf)],
    25: [(1, 999, math.nan), (4, 3, math.inf)],
}
SCALER = dict(init_scale=2.0**10, growth_factor=2.0, backoff_factor=0.5, growth_interval=3)
HP = dict(lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)


def scaled_grads(params, step, scale):
    """The gradients backward of a loss scaled by `scale` gives (`scale` is GradScaler.scale or
    a number): the unscaled stream of grad_for (which depends on the params) scaled, with
    NONFINITE's values in."""
    amp = AMPLITUDES[step % len(AMPLITUDES)]
    unscaled = [grad_for(p, step, k) * amp for k, p in enumerate(params)]
    grads = [scale(g) if callable(scale) else g * scale for g in unscaled]
    for k, i, v in NONFINITE.get(step, []):
        grads[k].view(-1)[i] = v
    return grads


def torch_phase(opt, scaler, params):
    """torch's AMP phase; returns (whether the step was skipped, clip_grad_norm_'s norm)."""
    steps_before = [opt.state[p]["step"].item() if p in opt.state else 0 for p in params]
    scaler.unscale_(opt)
    norm = torch.nn.utils.clip_grad_norm_(params, MAX_NORM, foreach=True).item()
    scaler.step(opt)
    scaler.update()
    skipped = [opt.state[p]["step"].item() for p in params] == steps_before
    return skipped, norm


def torch_clip_coef(norm):
    """clip_grad_norm_'s factor, in float32 as it computes it."""
    t = torch.tensor(norm, dtype=torch.float32)
    return torch.clamp(MAX_NORM / (t + 1e-6), max=1.0).item()


def same_nonfinite(a, b):
    return (math.isnan(a) and math.isnan(b)) or a == b


def test_amp_phase_matches_torch_step_for_step(steps=30):
    p0 = make_params()
    ref = [p.clone().requires_grad_() for p in p0]
    ours = [p.clone().requires_grad_() for p in p0]
    a = torch.optim.AdamW(ref, **HP, fused=True)
    scaler = torch.amp.GradScaler("cpu", **SCALER)
    b = oft.AdamW(ours, **HP, max_grad_norm=MAX_NORM, loss_scale="dynamic", **SCALER)
    skips, clipped, scales = 0, 0, set()
    for step in range(steps):
        scale = scaler.get_scale()
        assert b.loss_scale == scale, f"step {step}"
        scales.add(scale)
        for p, g in zip(ref, scaled_grads(ref, step, scaler.scale)):
            p.grad = g
        for p, g in zip(ours, scaled_grads(ours, step, b.loss_scale)):
            p.grad = g
        skipped, norm = torch_phase(a, scaler, ref)
        before = [p.detach().clone() for p in ours]
        b.step()
        r = b.last_step
        assert skipped == (step in NONFINITE), f"step {step}: torch"
        assert (r["outcome"] == "skipped_nonfinite") == skipped, f"step {step}: {r}"
        assert r["loss_scale"] == scale and r["next_loss_scale"] == scaler.get_scale(), step
        if skipped:
            skips += 1
            assert same_nonfinite(r["total_norm"], norm), f"step {step}: {r}, torch {norm}"
            assert all(torch.equal(p, q) for p, q in zip(ours, before)), f"step {step}"
            continue
        assert r["outcome"] == "applied"
        assert r["total_norm"] == pytest.approx(norm, rel=1e-5), f"step {step}"
        coef = torch_clip_coef(norm)
        if coef == 1.0:
            assert r["clip_coef"] == 1.0, f"step {step}: {r}"
        else:
            clipped += 1
            assert r["clip_coef"] == pytest.approx(coef, rel=1e-5), f"step {step}"
    # The run covered what it is meant to: skips, clipped and unclipped steps, growth and backoff.
    assert skips == len(NONFINITE) and 0 < clipped < steps - skips
    assert len(scales) >= 4 and max(scales) > SCALER["init_scale"]
    assert b.state[ours[0]]["step"].item() == a.state[ref[0]]["step"].item() == steps - skips
    assert max_abs(ours, ref) < 2e-5


def test_amp_phase_on_a_model_with_an_overflowing_loss():
    """The same phase through autograd: torch scales the loss by its scaler, optfuse's user by
    optimizer.loss_scale; two steps overflow the scaled loss to inf, so backward's gradients
    are inf / nan in both."""
    torch.manual_seed(0)
    model_a = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    model_b = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    model_b.load_state_dict(model_a.state_dict())
    a = torch.optim.AdamW(model_a.parameters(), **HP, fused=True)
    scaler = torch.amp.GradScaler("cpu", **SCALER)
    b = oft.AdamW(
        model_b.parameters(), **HP, max_grad_norm=MAX_NORM, loss_scale="dynamic", **SCALER
    )
    x, y = torch.randn(64, 16), torch.randn(64, 4)
    outcomes = []
    for step in range(30):
        blow_up = 1e36 if step in (6, 7) else 1.0  # times >= 2^10: beyond float32
        a.zero_grad()
        loss = torch.nn.functional.mse_loss(model_a(x), y) * blow_up
        scaler.scale(loss).backward()
        skipped, norm = torch_phase(a, scaler, list(model_a.parameters()))
        b.zero_grad()
        (torch.nn.functional.mse_loss(model_b(x), y) * blow_up * b.loss_scale).backward()
        b.step()
        r = b.last_step
        outcomes.append(r["outcome"])
        assert (r["outcome"] == "skipped_nonfinite") == skipped, f"step {step}: {r}"
        assert r["next_loss_scale"] == scaler.get_scale() == b.loss_scale, f"step {step}"
        if not skipped:
            assert r["total_norm"] == pytest.approx(norm, rel=1e-5), f"step {step}"
            assert r["clip_coef"] == pytest.approx(torch_clip_coef(norm), rel=1e-5), step
    assert outcomes.count("skipped_nonfinite") == 2
    assert max_abs(list(model_b.parameters()), list(model_a.parameters())) < 2e-5
