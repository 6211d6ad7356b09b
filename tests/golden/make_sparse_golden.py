#!/usr/bin/env python3
"""Golden trajectory of torch.optim.SparseAdam (optfuse's "sparseadam" / "lazyadam").

An embedding-like float32 parameter of ROWS x COLS, p0[r][c] = gen(7, r * COLS + c), trained for
STEPS steps with row-sparse gradients: at step t the rows ROWS_AT[t-1] (in that order: unsorted,
with consecutive runs, never a duplicate) get values[j][c] = gen(300 + t, j * COLS + c) * 0.125.
Writes tests/golden/sparse/sparseadam.json (not in data/: test_optim_golden owns that folder): the
rows per step, the param after every step, the final exp_avg / exp_avg_sq (rows never touched stay
exactly p0 and 0).

Run: /tmp/torchvenv/bin/python tests/golden/make_sparse_golden.py (gen() as in make_golden.py).
"""

import json
import os

import torch

ROWS, COLS, STEPS = 12, 5, 8
ROWS_AT = [[3, 4, 5], [0], [11, 10, 2, 3], [7, 8, 9, 1], [5], [6, 7, 0, 1, 2], [], [4, 9, 10, 11]]
HYPER = dict(lr=1e-2, betas=(0.8, 0.99), eps=1e-8, maximize=False)


def gen(seed, i):
    x = (i * 2654435761 + seed * 40503 + 12345) & 0xFFFFFFFF
    x ^= x >> 16
    x = (x * 0x45D9F3B) & 0xFFFFFFFF
    x ^= x >> 16
    return (x & 0xFFFFFF) / 8388608.0 - 1.0


def main():
    p = torch.tensor(
        [[gen(7, r * COLS + c) for c in range(COLS)] for r in range(ROWS)],
        dtype=torch.float32,
        requires_grad=True,
    )
    opt = torch.optim.SparseAdam([p], **HYPER)
    params = []
    for t in range(1, STEPS + 1):
        rows = ROWS_AT[t - 1]
        vals = torch.tensor(
            [[gen(300 + t, j * COLS + c) * 0.125 for c in range(COLS)] for j in range(len(rows))],
            dtype=torch.float32,
        ).reshape(len(rows), COLS)
        idx = torch.tensor([rows], dtype=torch.int64).reshape(1, len(rows))
        p.grad = torch.sparse_coo_tensor(idx, vals, (ROWS, COLS))
        opt.step()
        params.append([float("%.9g" % v) for v in p.detach().reshape(-1).tolist()])
    st = opt.state[p]
    out = {
        "torch_version": torch.__version__,
        "rows": ROWS,
        "cols": COLS,
        "steps": STEPS,
        "rows_at": ROWS_AT,
        "hyper": {"lr": HYPER["lr"], "betas": list(HYPER["betas"]), "eps": HYPER["eps"]},
        "p0_rule": "gen(7, r * cols + c)",
        "values_rule": "gen(300 + t, j * cols + c) * 0.125",
        "params": params,
        "exp_avg": ["%.9g" % v for v in st["exp_avg"].reshape(-1).tolist()],
        "exp_avg_sq": ["%.9g" % v for v in st["exp_avg_sq"].reshape(-1).tolist()],
    }
    out["exp_avg"] = [float(v) for v in out["exp_avg"]]
    out["exp_avg_sq"] = [float(v) for v in out["exp_avg_sq"]]
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sparse", "sparseadam.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    print("wrote", path)


if __name__ == "__main__":
    main()
