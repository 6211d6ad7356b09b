"""CUDA tensors through the device path (skipped without a GPU): every optimizer in place on
the GPU against the same run on the CPU, within the float32 bound of test_trajectories.py."""

import pytest
import torch

import optfuse.torch as oft
from conftest import grad_for, make_params, max_abs

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


@pytest.mark.parametrize(
    "name,kw",
    [
        ("AdamW", dict(lr=1e-2)),
        ("SGD", dict(lr=1e-2, momentum=0.9)),
        ("Adam", dict(lr=1e-2, amsgrad=True)),
    ],
)
def test_cuda_matches_cpu(name, kw):
    p0 = make_params()
    cpu = [p.clone().requires_grad_() for p in p0]
    gpu = [p.cuda().requires_grad_() for p in p0]
    a, b = getattr(oft, name)(cpu, **kw), getattr(oft, name)(gpu, **kw)
    for step in range(20):
        for k, (c, g) in enumerate(zip(cpu, gpu)):
            c.grad = grad_for(c, step, k)
            g.grad = c.grad.cuda()
        a.step()
        b.step()
    torch.cuda.synchronize()
    assert max_abs([g.cpu() for g in gpu], cpu) < 2e-5
