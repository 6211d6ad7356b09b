"""Lion, LAMB, LARS (not in torch.optim), SparseAdam and custom rules, each against a pure-torch
reference written from its paper / reference library, in float64 (so the reference's own
rounding is negligible). optfuse runs in float32: the bound is the float32 one of
test_trajectories.py against a float64 truth (2e-5 over these step counts), except for Lion,
whose sign() turns a rounding difference near 0 into a full lr step: there the bound is
counted in such flips (at most 1% of elements may differ by up to 2 * lr * steps)."""

import json
from pathlib import Path

import pytest
import torch

import optfuse.torch as oft
from conftest import grad_for, lockstep, make_params, max_abs

STEPS = 50


def lion_ref(ps, grads, state, lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0):
    for p, g in zip(ps, grads):
        m = state.setdefault(id(p), torch.zeros_like(p))
        p.mul_(1 - lr * weight_decay)
        p.add_(torch.sign(m * betas[0] + g * (1 - betas[0])), alpha=-lr)
        m.mul_(betas[1]).add_(g, alpha=1 - betas[1])


def lamb_ref(ps, grads, state, step, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01):
    for p, g in zip(ps, grads):
        m, v = state.setdefault(id(p), (torch.zeros_like(p), torch.zeros_like(p)))
        m.mul_(betas[0]).add_(g, alpha=1 - betas[0])
        v.mul_(betas[1]).addcmul_(g, g, value=1 - betas[1])
        u = (m / (1 - betas[0] ** step)) / ((v / (1 - betas[1] ** step)).sqrt() + eps)
        u = u + weight_decay * p
        pn, un = p.norm(), u.norm()
        trust = (pn / un) if pn > 0 and un > 0 else 1.0
        p.sub_(lr * trust * u)


def lars_ref(
    ps, grads, state, lr=0.1, momentum=0.9, weight_decay=0.0, trust_coefficient=1e-3, eps=1e-8
):
    for p, g in zip(ps, grads):
        pn, gn = p.norm(), g.norm()
        local = (
            trust_coefficient * pn / (gn + weight_decay * pn + eps) if pn > 0 and gn > 0 else 1.0
        )
        d = local * (g + weight_decay * p)
        if id(p) in state:
            d = state[id(p)].mul_(momentum).add_(d)
        else:
            state[id(p)] = d.clone()
        p.sub_(lr * d)


def run_both(ours_cls, ref_fn, kw, steps=STEPS, with_step=False):
    p0 = make_params()
    truth = [p.double() for p in p0]
    ours = [p.clone().requires_grad_() for p in p0]
    opt = ours_cls(ours, **kw)
    state = {}
    for step in range(steps):
        grads = [grad_for(t, step, k) for k, t in enumerate(truth)]
        if with_step:
            ref_fn(truth, grads, state, step + 1, **kw)
        else:
            ref_fn(truth, grads, state, **kw)
        for k, o in enumerate(ours):
            o.grad = grad_for(o, step, k)
        opt.step()
    return [o.detach() for o in ours], truth, p0


def test_lion():
    kw = dict(lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1)
    ours, truth, p0 = run_both(oft.Lion, lion_ref, kw)
    diff = torch.cat([(o.double() - t).abs().flatten() for o, t in zip(ours, truth)])
    assert (diff > 1e-5).float().mean() < 0.01 and diff.max() <= 2 * kw["lr"] * STEPS
    assert max_abs(ours, p0) > 1e-2


def test_lamb():
    kw = dict(lr=1e-2, weight_decay=0.01)
    ours, truth, p0 = run_both(oft.LAMB, lamb_ref, kw, with_step=True)
    assert max_abs(ours, truth) < 2e-5 and max_abs(ours, p0) > 1e-3


def test_lars():
    kw = dict(lr=0.5, momentum=0.9, weight_decay=1e-3)
    ours, truth, p0 = run_both(oft.LARS, lars_ref, kw)
    assert max_abs(ours, truth) < 2e-5 and max_abs(ours, p0) > 1e-3


def test_sparse_adam_matches_torch_on_an_embedding():
    torch.manual_seed(0)
    ea = torch.nn.Embedding(50, 8, sparse=True)
    eb = torch.nn.Embedding(50, 8, sparse=True)
    eb.load_state_dict(ea.state_dict())
    initial = ea.weight.detach().clone()
    a, b = (
        torch.optim.SparseAdam(ea.parameters(), lr=1e-2),
        oft.SparseAdam(eb.parameters(), lr=1e-2),
    )
    for step in range(STEPS):
        idx = torch.randint(0, 40, (16,), generator=torch.Generator().manual_seed(step))
        for emb, opt in ((ea, a), (eb, b)):
            opt.zero_grad()
            emb(idx).pow(2).sum().backward()
            opt.step()
    assert max_abs(list(eb.parameters()), list(ea.parameters())) < 2e-5
    moved = (eb.weight.detach() != initial).any(dim=1)
    assert 0 < moved.sum() <= 40  # rows 40.. are never sampled: they keep their values
    assert torch.equal(moved, (ea.weight.detach() != initial).any(dim=1))


# The Lion rule in the JSON rule form, shared with tests/test_custom_optim.cpp.
LION_RULE = json.loads((Path(__file__).parents[1] / "graphs" / "lion_rule.json").read_text())


def test_custom_rule_from_json_is_the_library_lion():
    """The same maths as the library's Lion: the same fused kernel after normalization, so the
    results must be bit-identical (one kernel, same inputs)."""
    p0 = make_params()
    a = [p.clone().requires_grad_() for p in p0]
    b = [p.clone().requires_grad_() for p in p0]
    lib = oft.Lion(a, lr=1e-3, weight_decay=0.1)
    custom = oft.Custom(b, json.dumps(LION_RULE), lr=1e-3, weight_decay=0.1)
    lockstep([(lib, a), (custom, b)], 20)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert custom.param_groups[0]["betas"] == (0.9, 0.99)
    keys = {u["key"] for u in lib._optfuse_binding.core.kernel_uses()}
    assert keys == {u["key"] for u in custom._optfuse_binding.core.kernel_uses()}
    with pytest.raises(TypeError, match="unknown option"):
        oft.Custom(b, LION_RULE, momentum=0.9)


def test_rule_builder_gives_the_library_kernel():
    """The Python builder's Lion is the same maths as the library's: same kernel key, and so
    the same bits (one kernel, same inputs)."""
    from optfuse.rule import Rule, sign

    r = Rule("built_lion", defaults={"lr": 1e-4, "betas": (0.9, 0.99), "weight_decay": 0.0})
    p, g, m = r.param(), r.grad(), r.state("exp_avg")
    lr, b1, b2, wd = r.scalars("lr", "beta1", "beta2", "weight_decay")
    r.update(p, p - lr * wd * p - lr * sign(m * b1 + g * (1 - b1)))
    r.update(m, b2 * m + (1 - b2) * g)
    p0 = make_params()
    a = [x.clone().requires_grad_() for x in p0]
    b = [x.clone().requires_grad_() for x in p0]
    lib, built = oft.Lion(a, lr=1e-3, weight_decay=0.1), oft.Custom(b, r, lr=1e-3, weight_decay=0.1)
    lockstep([(lib, a), (built, b)], 10)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    key = lambda o: {u["key"] for u in o._optfuse_binding.core.kernel_uses()}
    assert key(lib) == key(built)
    with pytest.raises(ValueError, match="updated twice"):
        r.update(m, m * 2)
