"""optfuse.torch.Muon against torch.optim.Muon itself, and the C / C++ API's orthogonalization
(CBLAS) against torch's.

Under optfuse.torch the Newton-Schulz iteration runs on torch's own ATen ops. With
ns_products="bf16" it is torch's iteration itself, and the runs differ only where optfuse's
element-wise f32 kernels round differently from torch's ops (its lerp, mul_ and add_: an FMA
contracted or not), by one f32 ulp of an element of the update; measured on the AMD EPYC (AVX2):
bit for bit. With "f32" (the default where torch has no fast bf16 products, as on that EPYC) every
product is summed in f32 in another order before its rounding to bf16, so an element near a bf16
midpoint rounds the other way and the trajectories drift apart slowly, the orthogonalization
keeping every step's size. Measured there after 100 steps: at most 0.4% of how far the params
moved (1.9e-3 of 0.52). Bound: 1% of the movement.
"""

import copy

import pytest
import torch

import optfuse.torch as oft
from optfuse import _core
from conftest import grad_for, max_abs

SHAPES = [(37, 19), (19, 37), (48, 48), (200, 150)]  # wide, tall, square, larger than one task
STEPS = 100


def make_params(shapes=SHAPES):
    g = torch.Generator().manual_seed(3)
    return [(0.05 * torch.randn(s, generator=g, dtype=torch.float64)).float() for s in shapes]


def lockstep(runs, steps):
    for step in range(steps):
        for opt, ps in runs:
            for k, p in enumerate(ps):
                p.grad = grad_for(p, step, k)
            opt.step()


CASES = [
    dict(lr=0.02, ns_products="bf16"),
    dict(lr=0.02, ns_products="f32"),
    dict(lr=0.01, nesterov=False, weight_decay=0.0, adjust_lr_fn="match_rms_adamw"),
    dict(lr=0.02, momentum=0.3, adjust_lr_fn="spectral_unclamped", ns_steps=3),
    dict(lr=0.02, ns_coefficients=(3.0, -3.2, 1.2), eps=1e-5, ns_products="bf16"),
]


@pytest.mark.parametrize("kw", CASES, ids=["bf16", "f32", "rms", "low-momentum", "coefficients"])
def test_trajectory_matches_torch(kw):
    p0 = make_params()
    ref = [p.clone().requires_grad_() for p in p0]
    ours = [p.clone().requires_grad_() for p in p0]
    theirs = {k: v for k, v in kw.items() if k != "ns_products"}
    a, b = torch.optim.Muon(ref, **theirs), oft.Muon(ours, **kw)
    lockstep([(a, ref), (b, ours)], STEPS)
    moved = max_abs(ref, p0)
    assert moved > 2 * kw["lr"]  # (several steps' worth)
    assert max_abs(ours, ref) <= 0.01 * moved
    for x, y in zip(ref, ours):  # (the buffers follow the gradients, which follow the params)
        want = a.state[x]["momentum_buffer"]
        assert (b.state[y]["momentum_buffer"] - want).abs().max() <= 0.01 * want.abs().max()


def test_checkpoints_move_both_ways():
    p0 = make_params()
    ref = [p.clone().requires_grad_() for p in p0]
    ours = [p.clone().requires_grad_() for p in p0]
    a, b = torch.optim.Muon(ref, lr=0.02), oft.Muon(ours, lr=0.02)
    lockstep([(a, ref), (b, ours)], 5)
    # (Copies: load_state_dict keeps a tensor of the right dtype and device as it is, so the two
    # optimizers would share, and both update, one buffer.)
    b.load_state_dict(copy.deepcopy(a.state_dict()))  # torch's state into optfuse, and back
    a.load_state_dict(copy.deepcopy(b.state_dict()))
    lockstep([(a, ref), (b, ours)], 5)
    assert max_abs(ours, ref) <= 0.01 * max_abs(ref, p0)
    assert sorted(b.state_dict()["state"][0]) == ["momentum_buffer"]


def test_torchs_checks_are_kept():
    with pytest.raises(ValueError, match="Muon only supports 2D parameters"):
        oft.Muon([torch.zeros(3, requires_grad=True)])
    with pytest.raises(ValueError, match="Adjust learning rate function bogus is not supported"):
        oft.Muon([torch.zeros(3, 3, requires_grad=True)], adjust_lr_fn="bogus")
    with pytest.raises(ValueError, match="momentum should be >= 0 but is: -1"):
        oft.Muon([torch.zeros(3, 3, requires_grad=True)], momentum=-1.0)


@pytest.mark.parametrize("shape", [(40, 24), (24, 40), (64, 64), (300, 200)])
def test_the_c_apis_orthogonalization_is_torchs_within_bf16_rounding(shape):
    """The C / C++ API's iteration (CBLAS, f32 sums rounded to bf16 after each product) against
    torch's (_zeropower_via_newtonschulz): the sums differ in order only, so a product near a bf16
    midpoint may round the other way and the iterations carry it on. The bounds of
    tests/test_optim_muon.cpp (expect_close_ns): |got - want|_F <= 2^-5 |want|_F and every
    element within 2^-4 of the largest."""
    from torch.optim._muon import _zeropower_via_newtonschulz

    g = torch.Generator().manual_seed(5)
    u = torch.randn(shape, generator=g) * 0.01
    want = _zeropower_via_newtonschulz(u, (3.4445, -4.775, 2.0315), 5, 1e-7).float()
    got = torch.empty_like(u)
    _core.newton_schulz_cblas(
        u.data_ptr(),
        got.data_ptr(),
        shape[0],
        shape[1],
        "newton_schulz:a=3.4445,b=-4.775,c=2.0315,steps=5,eps=1e-07,products=f32",
    )
    assert (got - want).norm().item() <= 2.0**-5 * want.norm().item()
    assert (got - want).abs().max().item() <= 2.0**-4 * want.abs().max().item()
