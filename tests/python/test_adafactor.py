"""optfuse.torch.Adafactor against torch.optim.Adafactor itself: 100 steps on matrices, a batch
of matrices, vectors and a 0-d param, with weight decay, maximize, both branches of
rho_t = min(lr, 1/sqrt(t)), update clipping active and not; its state in torch's layout
(row_var [..., R, 1], col_var [..., 1, C], variance), checkpoints both ways, the ValueError
texts, and the flags torch's class takes.

Tolerance (float32; torch's for-loop and foreach runs are two float32 evaluations of the same
formulas, optfuse a third): the same two checks as test_trajectories.py. Against float64 torch,
optfuse's error is at most 1.25x torch's float32 error plus 1e-7 (rounding noise between
equally accurate orders: optfuse reduces in double where torch reduces float32 norms, and
1/sqrt is correctly rounded in both). Against torch's float32 result directly, 2e-5 absolute
over 100 steps: each step moves a param by alpha / denom * u with |u| ~ 1 and alpha ~ rho_t *
RMS(p) <= 1e-1 here, and the two evaluations differ by a few ulp of that per step; gradients
depend on the params, so a difference propagates, and after 100 steps it stays at a few hundred
float32 ulps of O(1) params (measured 3.6e-7 to 4.3e-6, 5-55x below the bound, on an AVX2
CPU with torch 2.15; printed with -s).
"""

import copy
import math

import pytest
import torch

import optfuse.torch as oft
from conftest import grad_for, make_params, max_abs

STEPS = 100
SHAPES = [(37, 19), (3, 5, 7), (2, 3, 4, 5), (1000,), (129, 65), (1,), (40, 1), (1, 50)]

CASES = [
    dict(),
    dict(lr=0.15, weight_decay=0.05, maximize=True),
    dict(lr=0.12, beta2_decay=-0.5, eps=(1e-12, 1e-2), d=1.5, weight_decay=0.1),
    dict(lr=5e-3, eps=(None, 1e-4), d=1.0),
]


def ids(kw):
    return "-".join(f"{k}={v}" for k, v in kw.items()) or "defaults"


def scaled_grads(factor_at):
    """grad_for, multiplied by factor_at(step): a jump makes the update's RMS exceed d."""

    def make(p, step, k):
        return grad_for(p, step, k) * factor_at(step)

    return make


def run_with(make_opt, params, steps, grads=grad_for):
    ps = [p.clone().requires_grad_(True) for p in params]
    opt = make_opt(ps)
    for step in range(steps):
        for k, p in enumerate(ps):
            p.grad = grads(p, step, k)
        opt.step()
    return ps, opt


def clip_steps(kw, params, steps, grads):
    """The steps at which torch's update clipping is active for some param (RMS(u) > d)."""
    eps1 = (kw.get("eps") or (None,))[0] or torch.finfo(torch.float32).eps
    d = kw.get("d", 1.0)
    ps = [p.clone().requires_grad_(True) for p in params]
    opt = torch.optim.Adafactor(ps, **kw)
    out = set()
    for step in range(steps):
        for k, p in enumerate(ps):
            p.grad = grads(p, step, k)
        opt.step()
        for p in ps:
            st = opt.state[p]
            g = -p.grad if kw.get("maximize") else p.grad
            if p.dim() > 1:
                v = st["row_var"] @ st["col_var"]
                v = v / st["row_var"].mean(dim=-2, keepdim=True).clamp(min=eps1)
            else:
                v = st["variance"]
            u = v.clamp(min=eps1 * eps1).rsqrt() * g
            if u.norm().item() / math.sqrt(u.numel()) / d > 1:
                out.add(step)
    return out


@pytest.mark.parametrize("kw", CASES, ids=[ids(c) for c in CASES])
def test_hundred_steps_match_torch(kw):
    grads = scaled_grads(lambda s: 20.0 if s in (10, 11, 60) else 1.0)
    p32 = make_params(SHAPES)
    p64 = [p.double() for p in p32]
    ref64, _ = run_with(lambda ps: torch.optim.Adafactor(ps, **kw), p64, STEPS, grads)
    ref, _ = run_with(lambda ps: torch.optim.Adafactor(ps, **kw), p32, STEPS, grads)
    fast, _ = run_with(lambda ps: torch.optim.Adafactor(ps, foreach=True, **kw), p32, STEPS, grads)
    ours, opt = run_with(lambda ps: oft.Adafactor(ps, **kw), p32, STEPS, grads)
    err_torch = max_abs(ref, ref64)
    err_ours = max_abs(ours, ref64)
    print(
        f"\n{ids(kw)}: torch {err_torch:.2e}, optfuse {err_ours:.2e} from float64; "
        f"optfuse - torch {max_abs(ours, ref):.2e}, - torch foreach {max_abs(ours, fast):.2e}"
    )
    assert err_ours <= 1.25 * err_torch + 1e-7
    assert max_abs(ours, ref) < 2e-5
    assert max_abs(ours, fast) < 2e-5
    assert max_abs(ours, p32) > 1e-2  # the params moved
    # Update clipping ran on the steps the gradient jumped, and not on every step.
    clipped = clip_steps(kw, p32, 15, grads)
    assert 10 in clipped and len(clipped) < 15


def test_cases_take_both_branches_of_rho():
    """rho_t = min(lr, 1/sqrt(t)): lr on every step for lr <= 1e-1; for lr = 0.15 and 0.12,
    lr until 1/sqrt(t) falls below it (steps 45 and 70), 1/sqrt(t) after."""
    branches = {kw.get("lr", 1e-2) <= 1 / math.sqrt(t) for kw in CASES for t in range(1, STEPS + 1)}
    assert branches == {True, False}


def test_state_is_torchs_layout_and_values():
    """Names, shapes, dtypes and values of the state after 20 steps: row_var [..., R, 1] and
    col_var [..., 1, C] for params of 2+ dims, variance for the others, step a float32 0-d
    tensor; the values within 2e-6 relative of torch's (a few float32 roundings of means)."""
    p32 = make_params(SHAPES)
    ref, a = run_with(lambda ps: torch.optim.Adafactor(ps, lr=0.1), p32, 20)
    ours, b = run_with(lambda ps: oft.Adafactor(ps, lr=0.1), p32, 20)
    for x, y in zip(ref, ours):
        sa, sb = a.state[x], b.state[y]
        assert sorted(sa) == sorted(sb)
        for name, t in sa.items():
            u = sb[name]
            assert u.shape == t.shape and u.dtype == t.dtype, name
            if name == "step":
                assert torch.equal(u, t)
            else:
                assert torch.allclose(u, t, rtol=2e-6, atol=1e-30), name
    assert b.state[ours[1]]["row_var"].shape == (3, 5, 1)
    assert b.state[ours[1]]["col_var"].shape == (3, 1, 7)


@pytest.mark.parametrize("direction", ["torch_to_optfuse", "optfuse_to_torch"])
def test_checkpoints_move_both_ways(direction):
    """10 steps in one library, state_dict() loaded into the other, 10 more there: within 2e-5
    of 20 steps in torch; and the same checkpoint resumed in the same library is bit-identical."""
    kw = dict(lr=0.1, weight_decay=0.01)
    p32 = make_params(SHAPES)
    first, second = (
        (torch.optim.Adafactor, oft.Adafactor)
        if direction == "torch_to_optfuse"
        else (oft.Adafactor, torch.optim.Adafactor)
    )
    ps, opt = run_with(lambda ps: first(ps, **kw), p32, 10)
    sd = copy.deepcopy(opt.state_dict())  # (load_state_dict keeps tensors it needs not convert)
    qs = [p.detach().clone().requires_grad_(True) for p in ps]
    opt2 = second(qs, **kw)
    opt2.load_state_dict(sd)
    for step in range(10, 20):
        for k, q in enumerate(qs):
            q.grad = grad_for(q, step, k)
        opt2.step()
    whole, _ = run_with(lambda ps: torch.optim.Adafactor(ps, **kw), p32, 20)
    assert max_abs(qs, whole) < 2e-5
    assert opt2.state[qs[0]]["row_var"].shape == (37, 1)


def test_same_library_resume_is_bit_identical():
    kw = dict(lr=0.1)
    p32 = make_params(SHAPES)
    ps, opt = run_with(lambda ps: oft.Adafactor(ps, **kw), p32, 5)
    sd = copy.deepcopy(opt.state_dict())
    qs = [p.detach().clone().requires_grad_(True) for p in ps]
    opt2 = oft.Adafactor(qs, **kw)
    opt2.load_state_dict(sd)
    for step in range(5, 10):
        for pair in ((ps, opt), (qs, opt2)):
            for k, p in enumerate(pair[0]):
                p.grad = grad_for(p, step, k)
            pair[1].step()
    for x, y in zip(ps, qs):
        assert torch.equal(x, y)


def test_a_checkpoint_with_a_wrong_shape_is_refused():
    p = [torch.randn(4, 6, requires_grad=True)]
    opt = oft.Adafactor(p)
    p[0].grad = torch.ones(4, 6)
    opt.step()
    sd = opt.state_dict()
    sd["state"][0]["row_var"] = torch.zeros(4, 6)
    opt2 = oft.Adafactor(p)
    opt2.load_state_dict(sd)
    with pytest.raises(ValueError, match=r"has shape \(4, 6\), the state needs \(4, 1\)"):
        opt2.step()


BAD = [
    (dict(lr=-1.0), "Learning rate should be >= 0 but is: -1.0"),
    (dict(beta2_decay=0.5), "beta2_decay should be <= 0 but is: 0.5"),
    (dict(eps=(-1.0, 1e-3)), "epsilon1 should be >= 0 but is: -1.0"),
    (dict(eps=(None, -1.0)), "epsilon2 should be >= 0 but is: -1.0"),
    (dict(d=0.5), "Clipping threshold d should be >= 1 but is: 0.5"),
    (dict(weight_decay=-0.1), "weight_decay should be >= 0 but is: -0.1"),
]


@pytest.mark.parametrize("kw,message", BAD, ids=[m.split(" ")[0] for _, m in BAD])
def test_value_errors_are_torchs(kw, message):
    p = [torch.zeros(3, requires_grad=True)]
    with pytest.raises(ValueError) as theirs:
        torch.optim.Adafactor(p, **kw)
    with pytest.raises(ValueError) as ours:
        oft.Adafactor(p, **kw)
    assert str(theirs.value) == message
    assert str(ours.value) == message


def test_layouts_and_a_zero_dim_param():
    """A channels_last conv weight (factored over its last two dims in torch's logical order: its
    kernels get a contiguous copy), a transposed matrix and a 0-d param, against torch."""
    w = torch.randn(8, 4, 3, 5).to(memory_format=torch.channels_last)
    t = torch.randn(30, 20).t()
    s = torch.tensor(0.5)
    params = [w, t, s]
    ref, _ = run_with(lambda ps: torch.optim.Adafactor(ps, lr=0.1), params, 20)
    ours, _ = run_with(lambda ps: oft.Adafactor(ps, lr=0.1), params, 20)
    assert max_abs(ours, ref) < 5e-6
    assert ours[0].is_contiguous(memory_format=torch.channels_last)


def test_foreach_is_accepted():
    """torch's Adafactor takes foreach (and no capturable or differentiable flag)."""
    p = [torch.zeros(3, 4, requires_grad=True)]
    opt = oft.Adafactor(p, foreach=True)
    p[0].grad = torch.ones(3, 4)
    opt.step()
    assert opt.state[p[0]]["col_var"].shape == (1, 4)
