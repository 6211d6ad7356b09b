#!/usr/bin/env python3
"""Generate golden optimizer trajectories with real torch.optim.

What it does
    Runs 20 steps of several torch.optim optimizers (Adam, AdamW, SGD, Adagrad,
    RMSprop, Adamax, NAdam, RAdam, Adadelta, ASGD, Rprop with assorted options) on a single
    1-D float32 parameter of n = 257 elements, on CPU, using the
    single-tensor reference path (foreach=False, and fused=False where the
    class has that argument). Inputs come from an integer-only generator `gen` (below)
    that the C++ tests re-implement bit-exactly, so the C++ side can rebuild
    the same p0 / gradients / lr schedule and compare against these files.

What it writes
    tests/golden/data/<case>.json, one per case in CASES, with keys:
      case, torch_version, optimizer (lower-case torch class name),
      hyper (torch argument names; "lr" is lr0), n, steps, lr_schedule
      (the 20 per-step lrs, doubles), grad_seed_base, grad_scale_rule,
      params (20 lists: the parameter after steps 1..20) and
      state (final state tensors after step 20 under torch's names:
      exp_avg, exp_avg_sq, max_exp_avg_sq, momentum_buffer, sum, square_avg,
      grad_avg, exp_inf, acc_delta, ax, prev, step_size, as present; 0-d state
      such as NAdam's mu_product and ASGD's eta and mu is not written).
    Every float32 value is printed with '%.9g', which round-trips to the
    identical float32. lr_schedule values use repr() (exact doubles).

Inputs (t = 1..20)
    p0[i]          = gen(1, i)
    g_t[i]         = gen(100 + t, i) * 0.125
                     (amsgrad cases: * 0.5 if t <= 3 else * 0.0625)
    lr_t           = lr0 * (1.0 - 0.03 * (t - 1))   (python float),
                     written into param_groups[0]['lr'] before step t.

How to run (needs torch + numpy; torch is NOT a project build dependency)
    python3 -m venv /tmp/torchvenv && /tmp/torchvenv/bin/pip install torch numpy
    /tmp/torchvenv/bin/python tests/golden/make_golden.py [--check]
  --step-features-only writes only step_features.json (GradScaler, clip_grad_norm_);
  --cases a,b writes only those trajectories (not step_features.json).
  --check additionally re-implements the "adamw" case in numpy float64 and
  prints the max relative difference to torch.
"""

import inspect
import json
import os
import sys

import numpy as np
import torch

N = 257
STEPS = 20
GRAD_SEED_BASE = 100
OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


def gen(seed, i):  # float32-exact value in [-1, 1)
    x = (i * 2654435761 + seed * 40503 + 12345) & 0xFFFFFFFF
    x ^= x >> 16
    x = (x * 0x45D9F3B) & 0xFFFFFFFF
    x ^= x >> 16
    return (x & 0xFFFFFF) / 8388608.0 - 1.0


def grad_scale(amsgrad, t):
    if amsgrad:
        return 0.5 if t <= 3 else 0.0625
    return 0.125


GRAD_RULE_PLAIN = "g_t[i] = gen(100 + t, i) * 0.125"
GRAD_RULE_AMSGRAD = "g_t[i] = gen(100 + t, i) * (0.5 if t <= 3 else 0.0625)"

# (case, torch class, kwargs)
CASES = [
    (
        "adam",
        torch.optim.Adam,
        dict(
            lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=False, maximize=False
        ),
    ),
    (
        "adam_wd_amsgrad",
        torch.optim.Adam,
        dict(lr=2e-3, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.01, amsgrad=True, maximize=False),
    ),
    (
        "adamw",
        torch.optim.AdamW,
        dict(
            lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, amsgrad=False, maximize=False
        ),
    ),
    (
        "adamw_amsgrad",
        torch.optim.AdamW,
        dict(
            lr=3e-3, betas=(0.85, 0.995), eps=1e-8, weight_decay=0.1, amsgrad=True, maximize=False
        ),
    ),
    (
        "adam_maximize",
        torch.optim.Adam,
        dict(
            lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.001, amsgrad=False, maximize=True
        ),
    ),
    (
        "sgd_nesterov",
        torch.optim.SGD,
        dict(
            lr=0.05, momentum=0.9, dampening=0.0, weight_decay=1e-4, nesterov=True, maximize=False
        ),
    ),
    (
        "sgd_momentum_dampening",
        torch.optim.SGD,
        dict(lr=0.1, momentum=0.8, dampening=0.3, weight_decay=0.0, nesterov=False, maximize=False),
    ),
    (
        "sgd_plain_maximize",
        torch.optim.SGD,
        dict(lr=0.1, momentum=0.0, dampening=0.0, weight_decay=0.05, nesterov=False, maximize=True),
    ),
    (
        "adagrad",
        torch.optim.Adagrad,
        dict(
            lr=0.05,
            lr_decay=0.0,
            weight_decay=0.0,
            initial_accumulator_value=0.0,
            eps=1e-10,
            maximize=False,
        ),
    ),
    (
        "adagrad_decay_init_maximize",
        torch.optim.Adagrad,
        dict(
            lr=0.1,
            lr_decay=0.05,
            weight_decay=0.01,
            initial_accumulator_value=0.1,
            eps=1e-6,
            maximize=True,
        ),
    ),
    (
        "rmsprop",
        torch.optim.RMSprop,
        dict(
            lr=0.01,
            alpha=0.99,
            eps=1e-8,
            weight_decay=0.0,
            momentum=0.0,
            centered=False,
            maximize=False,
        ),
    ),
    (
        "rmsprop_centered_momentum",
        torch.optim.RMSprop,
        dict(
            lr=0.005,
            alpha=0.9,
            eps=1e-6,
            weight_decay=0.01,
            momentum=0.9,
            centered=True,
            maximize=False,
        ),
    ),
    (
        "rmsprop_momentum_maximize",
        torch.optim.RMSprop,
        dict(
            lr=0.01,
            alpha=0.95,
            eps=1e-8,
            weight_decay=0.0,
            momentum=0.5,
            centered=False,
            maximize=True,
        ),
    ),
    (
        "adamax",
        torch.optim.Adamax,
        dict(lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, maximize=False),
    ),
    (
        "adamax_wd_maximize",
        torch.optim.Adamax,
        dict(lr=5e-3, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.01, maximize=True),
    ),
    (
        "nadam",
        torch.optim.NAdam,
        dict(
            lr=2e-3,
            betas=(0.9, 0.999),
            eps=1e-8,
            weight_decay=0.0,
            momentum_decay=4e-3,
            decoupled_weight_decay=False,
            maximize=False,
        ),
    ),
    (
        "nadam_wd",
        torch.optim.NAdam,
        dict(
            lr=3e-3,
            betas=(0.8, 0.99),
            eps=1e-6,
            weight_decay=0.01,
            momentum_decay=0.01,
            decoupled_weight_decay=False,
            maximize=True,
        ),
    ),
    (
        "nadam_decoupled",
        torch.optim.NAdam,
        dict(
            lr=2e-3,
            betas=(0.9, 0.995),
            eps=1e-8,
            weight_decay=0.1,
            momentum_decay=4e-3,
            decoupled_weight_decay=True,
            maximize=False,
        ),
    ),
    # beta2 = 0.9 crosses rho_t > 5 at step 3, beta2 = 0.999 at step 6: both branches recorded.
    (
        "radam",
        torch.optim.RAdam,
        dict(
            lr=1e-3,
            betas=(0.9, 0.999),
            eps=1e-8,
            weight_decay=0.0,
            decoupled_weight_decay=False,
            maximize=False,
        ),
    ),
    (
        "radam_wd_maximize",
        torch.optim.RAdam,
        dict(
            lr=5e-3,
            betas=(0.8, 0.9),
            eps=1e-6,
            weight_decay=0.01,
            decoupled_weight_decay=False,
            maximize=True,
        ),
    ),
    (
        "radam_decoupled",
        torch.optim.RAdam,
        dict(
            lr=2e-3,
            betas=(0.9, 0.99),
            eps=1e-8,
            weight_decay=0.1,
            decoupled_weight_decay=True,
            maximize=False,
        ),
    ),
    (
        "adadelta",
        torch.optim.Adadelta,
        dict(lr=1.0, rho=0.9, eps=1e-6, weight_decay=0.0, maximize=False),
    ),
    (
        "adadelta_wd_maximize",
        torch.optim.Adadelta,
        dict(lr=0.5, rho=0.95, eps=1e-5, weight_decay=0.01, maximize=True),
    ),
    # Default t0 = 1e6: ax is a copy of the param. eta follows the lr of the step before.
    (
        "asgd",
        torch.optim.ASGD,
        dict(lr=1e-2, lambd=1e-4, alpha=0.75, t0=1e6, weight_decay=0.0, maximize=False),
    ),
    # t0 = 5: ax is a copy up to step 7, then a running average (mu = 1/2, 1/3, ...).
    (
        "asgd_averaging_wd_maximize",
        torch.optim.ASGD,
        dict(lr=5e-2, lambd=1e-2, alpha=0.6, t0=5.0, weight_decay=0.01, maximize=True),
    ),
    (
        "rprop",
        torch.optim.Rprop,
        dict(lr=1e-2, etas=(0.5, 1.2), step_sizes=(1e-6, 50.0), maximize=False),
    ),
    # Step sizes reach both bounds within a few steps: 0.01 -> 0.02 -> 0.04 -> 0.05 (max), and
    # 0.01 -> 0.003 -> 0.001 (min).
    (
        "rprop_clamped_maximize",
        torch.optim.Rprop,
        dict(lr=1e-2, etas=(0.3, 2.0), step_sizes=(1e-3, 0.05), maximize=True),
    ),
]

STATE_KEYS = (
    "exp_avg",
    "exp_avg_sq",
    "max_exp_avg_sq",
    "momentum_buffer",
    "sum",
    "square_avg",
    "grad_avg",
    "exp_inf",
    "acc_delta",
    "ax",
    "prev",
    "step_size",
)


def lr_schedule(lr0):
    return [lr0 * (1.0 - 0.03 * (t - 1)) for t in range(1, STEPS + 1)]


def p0_values():
    return [gen(1, i) for i in range(N)]


def grad_values(amsgrad, t):
    s = grad_scale(amsgrad, t)
    return [gen(GRAD_SEED_BASE + t, i) * s for i in range(N)]


def run_case(cls, kw):
    amsgrad = bool(kw.get("amsgrad", False))
    p = torch.tensor(p0_values(), dtype=torch.float32, requires_grad=True)
    extra = dict(foreach=False)
    if "fused" in inspect.signature(cls.__init__).parameters:
        extra["fused"] = False
    opt = cls([p], **extra, **kw)
    lrs = lr_schedule(kw["lr"])
    traj = []
    for t in range(1, STEPS + 1):
        opt.param_groups[0]["lr"] = lrs[t - 1]
        p.grad = torch.tensor(grad_values(amsgrad, t), dtype=torch.float32)
        opt.step()
        traj.append(p.detach().clone().numpy())
    st = opt.state[p]
    state = {}
    for k in STATE_KEYS:
        v = st.get(k)
        if isinstance(v, torch.Tensor):
            state[k] = v.detach().clone().numpy()
    return lrs, traj, state


# ---- JSON output with exact float32 text -----------------------------------


def f32s(v):
    s = "%.9g" % float(np.float32(v))
    assert np.float32(float(s)) == np.float32(v), (v, s)
    return s


def f32list(a):
    a = np.asarray(a, dtype=np.float32)
    assert np.all(np.isfinite(a)), "non-finite value"
    return "[" + ", ".join(f32s(x) for x in a) + "]"


def write_case(case, cls, kw, lrs, traj, state):
    hyper = {}
    for k, v in kw.items():
        hyper[k] = list(v) if isinstance(v, tuple) else v
    head = {
        "case": case,
        "torch_version": torch.__version__,
        "optimizer": cls.__name__.lower(),
        "hyper": hyper,
        "n": N,
        "steps": STEPS,
        "lr_schedule": lrs,  # json uses repr(): exact doubles
        "grad_seed_base": GRAD_SEED_BASE,
        "grad_scale_rule": GRAD_RULE_AMSGRAD if kw.get("amsgrad") else GRAD_RULE_PLAIN,
    }
    lines = ["{"]
    for k, v in head.items():
        lines.append("  %s: %s," % (json.dumps(k), json.dumps(v)))
    lines.append('  "params": [')
    lines.append(",\n".join("    " + f32list(x) for x in traj))
    lines.append("  ],")
    lines.append('  "state": {')
    lines.append(",\n".join("    %s: %s" % (json.dumps(k), f32list(v)) for k, v in state.items()))
    lines.append("  }")
    lines.append("}")
    text = "\n".join(lines) + "\n"
    json.loads(text)  # must be valid JSON
    path = os.path.join(OUT_DIR, case + ".json")
    with open(path, "w") as f:
        f.write(text)
    return path


# ---- optional self-check: AdamW in float64 from the documented algorithm ----


def numpy_adamw64(kw):
    b1, b2 = kw["betas"]
    eps, wd = kw["eps"], kw["weight_decay"]
    p = np.array(p0_values(), dtype=np.float64)
    m = np.zeros(N)
    v = np.zeros(N)
    out = []
    for t, lr in enumerate(lr_schedule(kw["lr"]), start=1):
        g = np.array(grad_values(False, t), dtype=np.float64)
        p = p * (1.0 - lr * wd)
        m = b1 * m + (1.0 - b1) * g
        v = b2 * v + (1.0 - b2) * g * g
        mhat = m / (1.0 - b1**t)
        vhat = v / (1.0 - b2**t)
        p = p - lr * mhat / (np.sqrt(vhat) + eps)
        out.append(p.copy())
    return out, m, v


# ---- step-level features: GradScaler and clip_grad_norm_ (separate from the trajectories) ----
# Writes step_features.json (next to this script; data/ holds only trajectories) for
# tests/test_optim_loss_scale.cpp and tests/test_optim_clip.cpp:
#   "grad_scaler": per case, torch.amp.GradScaler("cpu", ...) driven by a one-element SGD param
#       whose grad is inf on the steps flagged in "found_inf"; "scales" / "trackers" after each
#       update() (get_scale(), _growth_tracker).
#   "clip": per norm_type (2.0, "inf"), torch.nn.utils.clip_grad_norm_(max_norm=0.7) over two
#       tensors of 5 and 300 elements, grads gen(200 + t, i) * 0.5 for tensor t;
#       "total_norm" (float32, as returned) and "grads" after clipping.
STEP_SCALER_CASES = [
    (
        "pow2",
        dict(init_scale=65536.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=3),
        [0, 0, 0, 1, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0],
    ),
    (
        "odd_factors",
        dict(init_scale=1000.0, growth_factor=1.7, backoff_factor=0.3, growth_interval=2),
        [0, 0, 1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0],
    ),
    (
        "overflowing_growth",
        dict(init_scale=2.0**126, growth_factor=2.0, backoff_factor=0.5, growth_interval=1),
        [0, 0, 0, 1, 0],
    ),
]
STEP_CLIP_SIZES = [5, 300]


def step_features_golden():
    out = {"torch_version": torch.__version__, "grad_scaler": {}, "clip": {}}
    for name, kw, flags in STEP_SCALER_CASES:
        w = torch.nn.Parameter(torch.zeros(1))
        opt = torch.optim.SGD([w], lr=0.0)
        scaler = torch.amp.GradScaler("cpu", **kw)
        scales, trackers = [], []
        for f in flags:
            scaler.scale(torch.tensor(1.0))  # GradScaler creates its scale lazily here
            w.grad = torch.tensor([float("inf") if f else 1.0])
            scaler.step(opt)
            scaler.update()
            scales.append(float(scaler.get_scale()))
            trackers.append(int(scaler._growth_tracker.item()))
        out["grad_scaler"][name] = dict(kw, found_inf=flags, scales=scales, trackers=trackers)
    for norm_type in (2.0, "inf"):
        ps = []
        for t, n in enumerate(STEP_CLIP_SIZES):
            p = torch.nn.Parameter(torch.zeros(n))
            p.grad = torch.tensor([gen(200 + t, i) * 0.5 for i in range(n)], dtype=torch.float32)
            ps.append(p)
        nt = float("inf") if norm_type == "inf" else norm_type
        total = torch.nn.utils.clip_grad_norm_(ps, max_norm=0.7, norm_type=nt)
        out["clip"][str(norm_type)] = {
            "max_norm": 0.7,
            "sizes": STEP_CLIP_SIZES,
            "total_norm": f32s(total.item()),
            "grads": [[f32s(x) for x in p.grad.numpy()] for p in ps],
        }
    text = json.dumps(out, indent=1)
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "step_features.json")
    with open(path, "w") as f:
        f.write(text + "\n")
    print("step features -> %s" % os.path.relpath(path))


def main(argv):
    os.makedirs(OUT_DIR, exist_ok=True)
    torch.set_num_threads(1)
    only = None
    if "--cases" in argv:  # --cases a,b: (re)write only these trajectories
        only = set(argv[argv.index("--cases") + 1].split(","))
        unknown = only - {c for c, _, _ in CASES}
        if unknown:
            sys.exit("make_golden: unknown case(s) %s" % ", ".join(sorted(unknown)))
    else:
        step_features_golden()
    if "--step-features-only" in argv:
        return
    results = {}
    for case, cls, kw in CASES:
        if only is not None and case not in only:
            continue
        lrs, traj, state = run_case(cls, kw)
        results[case] = (kw, traj, state)
        path = write_case(case, cls, kw, lrs, traj, state)
        p0 = np.array(p0_values(), dtype=np.float32)
        moved = float(np.max(np.abs(traj[-1] - p0)))
        print(
            "%-24s -> %s  (max |p20-p0| = %.3g, state: %s)"
            % (case, os.path.relpath(path), moved, ",".join(state))
        )
    if "--check" in argv and "adamw" in results:
        kw, traj, state = results["adamw"]
        ref, m, v = numpy_adamw64(kw)
        rel = 0.0
        for a, b in zip(traj, ref):
            rel = max(
                rel, float(np.max(np.abs(a.astype(np.float64) - b) / np.maximum(np.abs(b), 1e-30)))
            )
        relm = float(np.max(np.abs(state["exp_avg"] - m) / np.maximum(np.abs(m), 1e-30)))
        relv = float(np.max(np.abs(state["exp_avg_sq"] - v) / np.maximum(np.abs(v), 1e-30)))
        print(
            "self-check adamw vs numpy float64: max rel diff params=%.3g "
            "exp_avg=%.3g exp_avg_sq=%.3g" % (rel, relm, relv)
        )


if __name__ == "__main__":
    main(sys.argv[1:])
