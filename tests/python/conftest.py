"""Shared helpers for the optfuse.torch tests: seeded gradient streams and run harnesses.

Every numeric test compares against torch.optim itself, the reference users check us against.
"""

import os

import pytest
import torch

# Default schedules, as in CTest (tests/CMakeLists.txt): the shipped databases apply to this
# machine's CPU class or a sibling one, and with them a tensor's kernel (and so the keys and bits
# the tests compare) would depend on which CPU runs the tests. Set before any engine is made.
os.environ.setdefault("OPTFUSE_SCHEDULES", "none")

# Ragged sizes: below and above one vector, one task (16384 elements) and several tasks.
SHAPES = [(37, 19), (1000,), (3, 5, 7), (1,), (129, 65), (200, 101)]


def make_params(shapes=SHAPES, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g, dtype=torch.float64).to(dtype) for s in shapes]


def grad_for(p, step, k):
    """A gradient that depends on the param (as in training, so differences propagate) plus
    noise that depends only on (step, tensor): the same stream in every run and dtype."""
    g = torch.Generator().manual_seed(1000 * step + k)
    noise = torch.randn(p.shape, generator=g, dtype=torch.float64)
    return (0.1 * p.detach().double() + noise).to(p.dtype)


def run(make_opt, params, steps, scheduler=None, set_to_none=True):
    """`steps` updates of `params` (leaf copies) by `make_opt(params)`; returns the params."""
    ps = [p.clone().requires_grad_(True) for p in params]
    opt = make_opt(ps)
    sched = scheduler(opt) if scheduler else None
    for step in range(steps):
        for k, p in enumerate(ps):
            p.grad = grad_for(p, step, k)
        opt.step()
        if sched:
            sched.step()
        opt.zero_grad(set_to_none=set_to_none)
    return [p.detach() for p in ps], opt


def lockstep(runs, steps):
    """Steps every (optimizer, params) of `runs` `steps` times, each with the gradient stream of
    grad_for."""
    for step in range(steps):
        for opt, ps in runs:
            for k, p in enumerate(ps):
                p.grad = grad_for(p, step, k)
            opt.step()


def max_abs(a, b):
    return max((x.double() - y.double()).abs().max().item() for x, y in zip(a, b))


@pytest.fixture
def params():
    return make_params()
