"""Adadelta, ASGD and Rprop against torch.optim itself, beyond the shared trajectory, checkpoint
and validation tests: torch's foreach implementation (its fastest on these), Rprop bit for bit
(its decisions are exact and each of its float32 ops rounds once, in torch and here, also on
NaN, infinite and zero gradients), ASGD's 0-d state (eta, mu, step) value for value, and the
flags torch's classes take."""

import pytest
import torch

import optfuse.torch as oft
from conftest import grad_for, lockstep, make_params, max_abs, run

STEPS = 60


def bits(t):
    return t.detach().contiguous().view(torch.int32)


def same_bits(a, b):
    return a.shape == b.shape and torch.equal(bits(a), bits(b))


FOREACH = [
    ("Adadelta", dict(weight_decay=1e-2)),
    ("ASGD", dict(lr=1e-2, t0=10.0, weight_decay=1e-2)),
    ("Rprop", dict(lr=1e-3, maximize=True)),
]


@pytest.mark.parametrize("name,kw", FOREACH, ids=[n for n, _ in FOREACH])
def test_matches_torch_foreach(name, kw):
    """foreach=True is torch's fastest implementation of these (no fused one). Its ASGD orders the
    update differently (p - eta * (g + lambd * p)) and averages even while mu is 1, so the bound
    is the float32 one of test_trajectories.py (2e-5 after 60 steps of lr <= 1e-2)."""
    p32 = make_params()
    ref, _ = run(lambda ps: getattr(torch.optim, name)(ps, foreach=True, **kw), p32, STEPS)
    ours, _ = run(lambda ps: getattr(oft, name)(ps, foreach=True, **kw), p32, STEPS)
    assert max_abs(ours, ref) < 2e-5
    assert max_abs(ours, p32) > 1e-3


RPROP = [
    dict(),
    dict(lr=1e-3, maximize=True),
    dict(lr=1e-2, etas=(0.3, 2.0), step_sizes=(1e-3, 5e-2)),
]


@pytest.mark.parametrize("foreach", [False, True])
@pytest.mark.parametrize("kw", RPROP, ids=["defaults", "maximize", "clamped"])
def test_rprop_is_torchs_bits(kw, foreach):
    p0 = make_params()
    ref = [p.clone().requires_grad_() for p in p0]
    ours = [p.clone().requires_grad_() for p in p0]
    a = torch.optim.Rprop(ref, foreach=foreach, **kw)
    b = oft.Rprop(ours, **kw)
    lockstep([(a, ref), (b, ours)], STEPS)
    for x, y in zip(ref, ours):
        assert same_bits(x, y)
        for name in ("prev", "step_size", "step"):
            assert same_bits(a.state[x][name], b.state[y][name]), name
    assert max_abs(ours, p0) > 1e-2


def test_rprop_special_gradients_are_torchs_bits():
    """torch's sign() is 0 for NaN and -0: a NaN gradient leaves the param and its step size,
    and is kept as prev (the next product is NaN: factor 1); inf * 0 is NaN too."""
    specials = [
        float("nan"),
        float("inf"),
        -float("inf"),
        0.0,
        -0.0,
        1.0,
        -1.0,
        3e-3,
        -2e-38,
        1e-40,
    ]
    n = len(specials)
    ref = torch.linspace(-1, 1, n * n).requires_grad_()
    ours = ref.detach().clone().requires_grad_()
    a, b = torch.optim.Rprop([ref], lr=1e-2), oft.Rprop([ours], lr=1e-2)
    for step in range(4):  # every pair (previous, current) of special values, in some element
        g = torch.tensor([specials[(i // n ** (step % 2)) % n] for i in range(n * n)])
        g = g.roll(step)
        ref.grad, ours.grad = g.clone(), g.clone()
        a.step()
        b.step()
        assert same_bits(ref, ours), step
        for name in ("prev", "step_size"):
            assert same_bits(a.state[ref][name], b.state[ours][name]), (step, name)


def test_asgd_state_is_torchs_value_for_value():
    """eta is computed from the lr of the step before (a scheduler's change reaches the update
    one step later), mu from the step count and t0; both are stored as torch's float32 0-d
    tensors, so after every step they are torch's values exactly. The lr changed before the first
    step is the one eta starts at, as torch makes its state then."""
    kw = dict(lr=0.05, lambd=1e-2, alpha=0.6, t0=5.0, weight_decay=1e-3)
    p0 = make_params()
    ref = [p.clone().requires_grad_() for p in p0]
    ours = [p.clone().requires_grad_() for p in p0]
    a, b = torch.optim.ASGD(ref, **kw), oft.ASGD(ours, **kw)
    runs = []
    for opt, ps in ((a, ref), (b, ours)):
        opt.param_groups[0]["lr"] = 0.03
        runs.append((opt, ps, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.9**s)))
    for step in range(30):
        for opt, ps, sched in runs:
            for k, p in enumerate(ps):
                p.grad = grad_for(p, step, k)
            opt.step()
            sched.step()
        for x, y in zip(ref, ours):
            for name in ("eta", "mu", "step"):
                sa, sb = a.state[x][name], b.state[y][name]
                assert sb.dtype == sa.dtype and sb.shape == () and torch.equal(sa, sb), name
    assert max_abs(ours, ref) < 2e-5
    assert max_abs([b.state[p]["ax"] for p in ours], [a.state[p]["ax"] for p in ref]) < 2e-5
    assert b.state[ours[0]]["mu"].item() < 1  # averaging was reached
    assert sorted(b.state[ours[0]]) == sorted(a.state[ref[0]])


@pytest.mark.parametrize("name", ["ASGD", "Rprop"])
def test_a_param_first_stepped_later_starts_from_the_lr_then(name):
    """torch makes Rprop's step_size (full of lr) and ASGD's eta (= lr) at a param's first step:
    a param without a gradient until step 3, under a changing lr, starts from the lr of step 3."""
    p0 = make_params()[:2]
    ref = [p.clone().requires_grad_() for p in p0]
    ours = [p.clone().requires_grad_() for p in p0]
    a, b = getattr(torch.optim, name)(ref, lr=1e-2), getattr(oft, name)(ours, lr=1e-2)
    for step in range(6):
        for opt, ps in ((a, ref), (b, ours)):
            opt.param_groups[0]["lr"] = 1e-2 * (step + 1)
            for k, p in enumerate(ps):
                p.grad = grad_for(p, step, k) if k == 0 or step >= 2 else None
            opt.step()
    key = "step_size" if name == "Rprop" else "eta"
    assert torch.equal(a.state[ref[1]][key], b.state[ours[1]][key])
    assert max_abs(ours, ref) < 1e-6
    if name == "Rprop":
        assert all(same_bits(x, y) for x, y in zip(ref, ours))


@pytest.mark.parametrize("name", ["Adadelta", "ASGD", "Rprop"])
def test_torch_only_flags_are_refused_and_foreach_is_accepted(name):
    cls = getattr(oft, name)
    p = [torch.zeros(3, requires_grad=True)]
    for flag in ("capturable", "differentiable"):
        extra = dict(foreach=True) if name == "ASGD" and flag == "capturable" else {}
        with pytest.raises(ValueError, match=f"{flag}=True is not supported"):
            cls(p, **{flag: True}, **extra)
    opt = cls(p, foreach=True)
    p[0].grad = torch.ones(3)
    opt.step()
    assert opt.last_step["outcome"] == "applied" and opt.state[p[0]]["step"].item() == 1


@pytest.mark.parametrize("name", ["Adadelta", "ASGD", "Rprop"])
def test_bf16_params_with_an_f32_master_follow_the_f32_run(name):
    """16-bit params get optfuse's f32 master copy: the f32 trajectory, rounded to bf16."""
    p32 = make_params()
    kw = dict(lr=1e-3) if name == "Rprop" else {}
    ref, _ = run(lambda ps: getattr(oft, name)(ps, **kw), p32, 20)
    ours, opt = run(lambda ps: getattr(oft, name)(ps, **kw), [p.bfloat16() for p in p32], 20)
    masters = [opt.state[p]["master"] for g in opt.param_groups for p in g["params"]]
    assert max_abs(masters, ref) < 1e-2  # the grads differ by bf16 rounding (grad_for)
    assert all(o.dtype == torch.bfloat16 for o in ours)
    assert max_abs(ours, masters) <= max(m.abs().max().item() for m in masters) * 2**-8
