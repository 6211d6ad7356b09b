"""optfuse's parallel loops on torch's OpenMP threads (optfuse._engine.share_openmp) give the
bits optfuse's own threads give: the same kernels run the same tasks over the same ranges, only
the threads differ (include/optfuse/parallel.h)."""

import os
import subprocess
import sys

import optfuse._core as core
import optfuse.torch  # noqa: F401  (shares torch's OpenMP runtime at import)

RUN = r"""
import sys, torch
import optfuse.torch as oft, optfuse._core as core
sys.path.insert(0, sys.argv[1])
from conftest import lockstep, make_params
shapes = [(1 << 20,), (300, 7)] + [(1000 + i,) for i in range(64)]
ps = [p.requires_grad_() for p in make_params(shapes)]
lockstep([(oft.AdamW(ps, lr=1e-2), ps)], 3)
torch.save([core.openmp_in_use()] + [p.detach() for p in ps], sys.argv[2])
"""


def test_torch_openmp_is_used_and_changes_no_bit(tmp_path):
    import torch

    assert core.openmp_in_use()
    out = {}
    for flag in ("1", "0"):
        path = tmp_path / f"{flag}.pt"
        env = {**os.environ, "OPTFUSE_OPENMP": flag}
        subprocess.run(
            [sys.executable, "-c", RUN, os.path.dirname(__file__), str(path)],
            env=env,
            check=True,
            timeout=300,
        )
        out[flag] = torch.load(path)
    assert out["1"][0] is True and out["0"][0] is False
    assert all(torch.equal(a, b) for a, b in zip(out["1"][1:], out["0"][1:]))
