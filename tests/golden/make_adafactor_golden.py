#!/usr/bin/env python3
"""Generate golden torch.optim.Adafactor trajectories.

What it does
    Runs 30 steps of torch.optim.Adafactor (CPU, float32, foreach=False: the single-tensor
    path) on three params in one group: a vector (257), a matrix (13 x 37) and a batch of
    matrices (3 x 9 x 17, factored per 9 x 17 matrix), for each case in CASES. Inputs come
    from the integer-only generator `gen` of make_golden.py, which the C++ tests re-implement.

What it writes
    tests/golden/adafactor/<case>.json: case, torch_version, hyper (torch argument names,
    "eps" a list whose first entry may be null), steps, lr_schedule (per-step lrs, doubles),
    recorded (the steps whose params are written), and per param ("vector", "matrix",
    "batched"): shape, the param after each recorded step ("params") and the final state
    ("row_var" and "col_var", or "variance", flattened; torch's shapes are [..., R, 1] and
    [..., 1, C]). Float32 values use '%.9g', which round-trips.

Inputs (param k = 0, 1, 2; t = 1..30)
    p0[i]  = gen(1 + k, i)
    g_t[i] = gen(100 + 10 * k + t, i) * scale_t,
             scale_t = 8 on steps 6 and 7 (a jump that makes the update's RMS exceed d, so
             that update clipping is active there), 0.125 otherwise
    lr_t   = lr0 * (1 - 0.02 * (t - 1)), set before step t

How to run (torch is not a build dependency)
    python3 -m venv /tmp/torchvenv && /tmp/torchvenv/bin/pip install torch numpy
    /tmp/torchvenv/bin/python tests/golden/make_adafactor_golden.py
"""

import json
import os

import numpy as np
import torch

from make_golden import f32list, gen

STEPS = 30
RECORDED = [1, 6, 7, 9, 30]  # clipped on 6 and 7; rho_t switches at 9 in the second case
SHAPES = {"vector": [257], "matrix": [13, 37], "batched": [3, 9, 17]}
OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "adafactor")

# (case, kwargs): lr 1e-2 keeps rho_t = lr (lr < 1 / sqrt(t) for t < 10^4); lr 0.4 takes the
# other branch from step 7 (1 / sqrt(t) < 0.4); d = 1 clips on the steps where the gradient
# jumps, d = 4 never does.
CASES = [
    (
        "adafactor",
        dict(lr=1e-2, beta2_decay=-0.8, eps=(None, 1e-3), d=1.0, weight_decay=0.0, maximize=False),
    ),
    (
        "adafactor_lr_wd_maximize",
        dict(lr=0.4, beta2_decay=-0.5, eps=(1e-10, 1e-3), d=1.0, weight_decay=0.05, maximize=True),
    ),
    (
        "adafactor_unclipped",
        dict(lr=0.2, beta2_decay=-0.7, eps=(None, 1e-2), d=4.0, weight_decay=0.1, maximize=False),
    ),
]


def grad_scale(t):
    return 8.0 if t in (6, 7) else 0.125


def lr_schedule(lr0):
    return [lr0 * (1.0 - 0.02 * (t - 1)) for t in range(1, STEPS + 1)]


def run_case(kw):
    params = []
    for k, shape in enumerate(SHAPES.values()):
        n = int(np.prod(shape))
        params.append(
            torch.tensor([gen(1 + k, i) for i in range(n)], dtype=torch.float32)
            .reshape(shape)
            .requires_grad_()
        )
    opt = torch.optim.Adafactor(params, foreach=False, **kw)
    lrs = lr_schedule(kw["lr"])
    traj = {name: [] for name in SHAPES}
    for t in range(1, STEPS + 1):
        opt.param_groups[0]["lr"] = lrs[t - 1]
        for k, p in enumerate(params):
            n = p.numel()
            p.grad = torch.tensor(
                [gen(100 + 10 * k + t, i) * grad_scale(t) for i in range(n)], dtype=torch.float32
            ).reshape(p.shape)
        opt.step()
        if t in RECORDED:
            for name, p in zip(SHAPES, params):
                traj[name].append(p.detach().clone().reshape(-1).numpy())
    out = {}
    for name, p in zip(SHAPES, params):
        st = opt.state[p]
        out[name] = {
            "params": traj[name],
            "state": {k: v.detach().reshape(-1).numpy() for k, v in st.items() if k != "step"},
        }
    return lrs, out


def write_case(case, kw, lrs, out):
    hyper = {k: list(v) if isinstance(v, tuple) else v for k, v in kw.items()}
    lines = ["{"]
    head = {
        "case": case,
        "torch_version": torch.__version__,
        "hyper": hyper,
        "steps": STEPS,
        "lr_schedule": lrs,
        "recorded": RECORDED,
    }
    for k, v in head.items():
        lines.append("  %s: %s," % (json.dumps(k), json.dumps(v)))
    entries = []
    for name, shape in SHAPES.items():
        body = [
            "    %s: {" % json.dumps(name),
            '      "shape": %s,' % json.dumps(shape),
            '      "params": [',
        ]
        body.append(",\n".join("        " + f32list(x) for x in out[name]["params"]))
        body.append("      ],")
        body.append('      "state": {')
        body.append(
            ",\n".join(
                "        %s: %s" % (json.dumps(k), f32list(v))
                for k, v in out[name]["state"].items()
            )
        )
        body.append("      }")
        body.append("    }")
        entries.append("\n".join(body))
    lines.append('  "tensors": {')
    lines.append(",\n".join(entries))
    lines.append("  }")
    lines.append("}")
    text = "\n".join(lines) + "\n"
    json.loads(text)
    path = os.path.join(OUT_DIR, case + ".json")
    with open(path, "w") as f:
        f.write(text)
    print("%s -> %s" % (case, os.path.relpath(path)))


def main():
    os.makedirs(OUT_DIR, exist_ok=True)
    torch.set_num_threads(1)
    for case, kw in CASES:
        lrs, out = run_case(kw)
        write_case(case, kw, lrs, out)


if __name__ == "__main__":
    main()
