"""Captured rules (optfuse.torch.rule / from_rule): PyTorch functions traced into optfuse graphs.

Each rule of capture_rules.py is written twice (in place and functional). Checked:
- both spellings reach one kernel key, and it is the library's where the library has the same
  maths (Adan has no library rule: the two spellings are compared with each other);
- 100 steps match the same function run eagerly by torch in float32 (tolerance below);
- where the key is the library's, the bits are the library optimizer's (one kernel, the same
  scalars);
- the errors: an op outside the accepted set, a scalar made a Python number, a write to the
  gradient, a reduction optfuse cannot express, each naming the op and the line.

Tolerance against eager torch, float32, 100 steps: the fused kernel rounds differently from
torch's op-by-op run in a few places (scalar math on the host in double and rounded once,
reassociated uniform factors, x * (1/bc) for x / bc, a fused multiply-add on one side and two
roundings on the other). The last two operations of the param update (the decay and the step)
may each round differently, by at most an ulp, so a param drifts from torch's by at most
2 ulp(|p|) <= 2 * eps32 * max(|p|, 1) per step: after N steps, 2 N eps32 * max(|p|, 1) (2.4e-5
for N = 100 and |p| <= 1). Measured, in units of eps32 * max(|p|, 1) after 100 steps: Lion 85,
Adan 44, AdamW 41, the others below 5. A wrong formula is off by about lr per step.
"""

import math

import pytest
import torch

import optfuse.torch as oft
from capture_rules import (
    ADAM_DEFAULTS,
    ADAN_DEFAULTS,
    LION_DEFAULTS,
    SGD_DEFAULTS,
    adam_functional,
    adam_inplace,
    adamw_functional,
    adamw_inplace,
    adan_functional,
    adan_inplace,
    lion_functional,
    lion_inplace,
    sgd_gc_functional,
    sgd_gc_inplace,
    sgd_host_scalars,
    sgd_nesterov_functional,
    sgd_nesterov_inplace,
)
from conftest import grad_for, make_params

STEPS = 100
ULPS_PER_STEP = 2
SHAPES = [(37, 19), (1000,), (3, 5, 7), (129, 65)]
SHAPES_2D = [(37, 19), (129, 65), (8, 300)]


def keys(opt) -> set:
    return {u["key"] for u in opt._optfuse_binding.core.kernel_uses()}


def eager(fn, params, defaults, steps, host_scalars=None):
    """`fn` run by torch op by op on every param: the reference. Scalars are 0-dim float64
    tensors (scalar math in double, as optfuse's host does); state starts at zero."""
    rule = oft.rule(fn)
    ps = [p.clone() for p in params]
    states = [{n: torch.zeros_like(p) for n in rule.state_names} for p in ps]
    for step in range(1, steps + 1):
        hp = dict(defaults)
        if host_scalars is not None:
            hp.update(host_scalars(defaults, step))
        kw = {}
        for k in rule.scalars:
            v = step if k == "step" else hp[k]
            if isinstance(v, (tuple, list)):
                kw[k] = tuple(torch.tensor(x, dtype=torch.float64) for x in v)
            else:
                kw[k] = torch.tensor(v, dtype=torch.bool if isinstance(v, bool) else torch.float64)
        for i, p in enumerate(ps):
            g = grad_for(p, step - 1, i)
            args = {rule.param: p, rule.grad: g, **states[i]}
            out = fn(*(args[n] for n, _ in rule.tensors), **kw)
            if isinstance(out, torch.Tensor):
                out = {rule.param: out}
            elif isinstance(out, (tuple, list)):
                out = dict(zip([rule.param] + rule.state_names, out))
            for n, v in (out or {}).items():
                (p if n == rule.param else states[i][n]).copy_(v)
    return ps


def captured(fn, params, defaults, steps, host_scalars=None, **kw):
    ps = [p.clone().requires_grad_() for p in params]
    opt = oft.from_rule(fn, ps, defaults, host_scalars=host_scalars, **kw)
    for step in range(steps):
        for i, p in enumerate(ps):
            p.grad = grad_for(p, step, i)
        opt.step()
    return [p.detach() for p in ps], opt


def library(make, params, steps):
    ps = [p.clone().requires_grad_() for p in params]
    opt = make(ps)
    for step in range(steps):
        for i, p in enumerate(ps):
            p.grad = grad_for(p, step, i)
        opt.step()
    return [p.detach() for p in ps], opt


def close(got, want, steps=STEPS) -> bool:
    """Within ULPS_PER_STEP * steps * eps32 * max(|want|, 1) element-wise (module doc)."""
    eps = torch.finfo(torch.float32).eps
    return all(
        ((x - y).abs() <= ULPS_PER_STEP * steps * eps * y.abs().clamp(min=1)).all()
        for x, y in zip(got, want)
    )


def max_abs(a, b) -> float:
    return max((x - y).abs().max().item() for x, y in zip(a, b))


CASES = {
    # name: (in-place, functional, defaults, host_scalars, shapes, the library optimizer or None)
    "adamw": (
        adamw_inplace,
        adamw_functional,
        ADAM_DEFAULTS,
        None,
        SHAPES,
        lambda ps: oft.AdamW(ps, lr=1e-3, weight_decay=1e-2),
    ),
    "adam": (
        adam_inplace,
        adam_functional,
        ADAM_DEFAULTS,
        None,
        SHAPES,
        lambda ps: oft.Adam(ps, lr=1e-3, weight_decay=1e-2),
    ),
    "sgd_nesterov": (
        sgd_nesterov_inplace,
        sgd_nesterov_functional,
        SGD_DEFAULTS,
        sgd_host_scalars,
        SHAPES,
        lambda ps: oft.SGD(ps, lr=1e-2, momentum=0.9, nesterov=True, weight_decay=1e-4),
    ),
    "lion": (
        lion_inplace,
        lion_functional,
        LION_DEFAULTS,
        None,
        SHAPES,
        lambda ps: oft.Lion(ps, lr=1e-4, weight_decay=0.1),
    ),
    # Adan: optfuse has no library Adan, so only the two spellings are compared.
    "adan": (adan_inplace, adan_functional, ADAN_DEFAULTS, None, SHAPES, None),
    # A row reduction: gradient centralization, the library's SGD(grad_centralization=True),
    # which centralizes only tensors of >= 2 dims; compared on 2-D weights.
    "sgd_gc": (
        sgd_gc_inplace,
        sgd_gc_functional,
        SGD_DEFAULTS,
        sgd_host_scalars,
        SHAPES_2D,
        lambda ps: oft.SGD(ps, lr=1e-2, momentum=0.9, weight_decay=1e-4, grad_centralization=True),
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_both_spellings_one_kernel_and_the_eager_result(name):
    inplace, functional, defaults, host, shapes, lib = CASES[name]
    params = make_params(shapes)
    got_i, opt_i = captured(inplace, params, defaults, STEPS, host)
    got_f, opt_f = captured(functional, params, defaults, STEPS, host)
    assert keys(opt_i) == keys(opt_f)
    assert len(keys(opt_i)) == 1
    for fn, got in ((inplace, got_i), (functional, got_f)):
        want = eager(fn, params, defaults, STEPS, host)
        assert close(got, want), (fn.__name__, max_abs(got, want))
        assert max_abs(got, params) > 1e-2  # it moved: the comparison means something
    if lib is not None:
        ref, opt_l = library(lib, params, STEPS)
        assert keys(opt_i) == keys(opt_l)
        assert all(torch.equal(x, y) for x, y in zip(got_i, ref))


def test_row_reduction_on_1d_tensors_is_the_whole_tensor():
    """A 1-D tensor is one row: `dim=-1` on it is its whole mean, as eagerly."""
    params = make_params([(1000,), (7,)])
    got, _ = captured(sgd_gc_inplace, params, SGD_DEFAULTS, 20, sgd_host_scalars)
    want = eager(sgd_gc_inplace, params, SGD_DEFAULTS, 20, sgd_host_scalars)
    assert close(got, want, 20)


def test_scalars_stay_runtime_values():
    """lr, betas and the step are kernel scalars: changing them recompiles nothing and
    changes the result as eagerly."""
    rule = oft.rule(adamw_inplace)
    graph = rule.to_json(ADAM_DEFAULTS)["graph"]
    assert {"lr", "beta1", "beta2", "eps", "weight_decay", "step"} <= {
        s if isinstance(s, str) else s["name"] for s in graph["scalars"]
    }
    assert not [n for n in graph["nodes"] if "const" in n]  # no value was baked in
    params = make_params([(37, 19)])
    ps = [p.clone().requires_grad_() for p in params]
    opt = oft.from_rule(adamw_inplace, ps, ADAM_DEFAULTS)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    from optfuse import engine

    for step in range(6):
        ps[0].grad = grad_for(ps[0], step, 0)
        opt.step()
        sched.step()
        if step == 0:
            compiles = engine().counters()["compiles"]
    assert engine().counters()["compiles"] == compiles
    want = params[0].clone()
    st = {"exp_avg": torch.zeros_like(want), "exp_avg_sq": torch.zeros_like(want)}
    for step in range(1, 7):
        lr = 1e-3 * 0.5 ** ((step - 1) // 2)
        t = lambda v: torch.tensor(v, dtype=torch.float64)
        adamw_inplace(
            want,
            grad_for(want, step - 1, 0),
            st["exp_avg"],
            st["exp_avg_sq"],
            lr=t(lr),
            betas=(t(0.9), t(0.999)),
            eps=t(1e-8),
            weight_decay=t(1e-2),
            maximize=torch.tensor(False),
            step=t(step),
        )
    assert close([ps[0].detach()], [want], 6)


def test_optimizer_behaves_like_the_builtins():
    """param groups with their own options, state in optimizer.state under the function's
    names, state_dict round trip, state_init."""
    params = make_params([(37, 19), (1000,)])
    a = [p.clone().requires_grad_() for p in params]
    opt = oft.from_rule(
        lion_inplace,
        [{"params": a[:1]}, {"params": a[1:], "lr": 1e-3}],
        LION_DEFAULTS,
        state_init={"exp_avg": 0.5},
    )
    for step in range(3):
        for i, p in enumerate(a):
            p.grad = grad_for(p, step, i)
        opt.step()
    assert set(opt.state[a[0]]) == {"exp_avg", "step"}
    assert opt.param_groups[1]["lr"] == 1e-3 and opt.param_groups[0]["lr"] == 1e-4
    want = [p.clone() for p in params]
    st = [torch.full_like(p, 0.5) for p in want]
    t = lambda v: torch.tensor(v, dtype=torch.float64)
    for step in range(3):
        for i, (p, lr) in enumerate(zip(want, (1e-4, 1e-3))):
            lion_inplace(
                p,
                grad_for(p, step, i),
                st[i],
                lr=t(lr),
                betas=(t(0.9), t(0.99)),
                weight_decay=t(0.1),
            )
    assert close([p.detach() for p in a], want, 3)
    # A checkpoint resumes bit for bit.
    b = [p.detach().clone().requires_grad_() for p in a]
    opt_b = oft.from_rule(lion_inplace, [{"params": b[:1]}, {"params": b[1:]}], LION_DEFAULTS)
    opt_b.load_state_dict(opt.state_dict())
    for o, ps in ((opt, a), (opt_b, b)):
        for i, p in enumerate(ps):
            p.grad = grad_for(p, 3, i)
        o.step()
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    # copy.deepcopy keeps the rule (and steps as the original does).
    import copy

    c = copy.deepcopy((opt_b, b))
    for o, ps in ((opt_b, b), c):
        for i, p in enumerate(ps):
            p.grad = grad_for(p, 4, i)
        o.step()
    assert all(torch.equal(x, y) for x, y in zip(b, c[1]))


def test_explain_names_idioms_clusters_and_the_key(capsys):
    rule = oft.rule(adamw_inplace)
    a = rule.explain(ADAM_DEFAULTS)
    out = capsys.readouterr().out
    for text in (
        "traced (aten ops)",
        "aten.lerp",
        "idioms:",
        "maximize",
        "lerp",
        "bias_correction",
        "step_size = lr/(1-pow(beta1,step))",
        "canonical graph",
        "clusters (1, 1 kernel(s))",
        "key " + a["kernel_keys"][0],
    ):
        assert text in out, text
    params = make_params([(37, 19)])
    _, opt = captured(adamw_inplace, params, ADAM_DEFAULTS, 1)
    assert set(a["kernel_keys"]) == keys(opt)


def test_explain_takes_the_host_scalars_from_rule_does(capsys):
    rule = oft.rule(sgd_nesterov_inplace)
    with pytest.raises(oft.CaptureError, match="host_scalars"):
        rule.explain(SGD_DEFAULTS)  # buf_decay and grad_coef come from host_scalars
    a = rule.explain(SGD_DEFAULTS, host_scalars=sgd_host_scalars)
    assert "buf_decay" in capsys.readouterr().out
    _, opt = captured(
        sgd_nesterov_inplace, make_params([(37, 19)]), SGD_DEFAULTS, 1, sgd_host_scalars
    )
    assert set(a["kernel_keys"]) == keys(opt)


def test_annotations_choose_the_roles():
    @oft.rule
    def sgd(g: oft.Grad, p: oft.Param, *, lr):
        p.sub_(lr * g)

    assert sgd.tensors == [("g", "grad"), ("p", "param")]
    params = make_params([(10, 3)])
    got, _ = captured(sgd, params, {"lr": 0.1}, 3)
    want = params[0].clone()
    for s in range(3):
        want -= 0.1 * grad_for(want, s, 0)
    assert close(got, [want], 3)


def test_whole_tensor_reductions():
    """A normalized-gradient step (g / |g|, mean and max over the tensor): one kernel with the
    reductions as its prologue."""

    def normalized(p, grad, *, lr, eps):
        scale = grad.norm() + eps + grad.abs().amax() * 0 + grad.mean() * 0
        p.sub_(lr * grad / scale)

    params = make_params([(37, 19), (1000,)])
    got, opt = captured(normalized, params, {"lr": 0.1, "eps": 1e-8}, 10)
    assert len(keys(opt)) == 1
    want = eager(normalized, params, {"lr": 0.1, "eps": 1e-8}, 10)
    assert close(got, want, 10)


def test_the_other_accepted_ops_match_eager():
    """copy_, clamp_, maximum / minimum, where, isfinite, exp / log, pow, abs / sign, casts and
    p.data (older optimizer code) in one rule, against the same function run eagerly. Tolerance
    1e-5 relative over 5 steps: exp and log are not correctly rounded in either library (a few
    ulp each), on values of magnitude ~1."""

    def kitchen(p, grad, buf, *, lr, eps):
        buf.copy_(torch.maximum(buf * 0.9, grad.abs()))
        u = grad / (buf + eps)
        u = torch.where(u.isfinite(), u, 0.0).clamp_(-1.0, 1.0)
        s = torch.exp(torch.log(buf + 1.0)) - 1.0
        pos = (grad > 0).float()
        step = u * s.pow(0.5) * torch.sign(grad) + torch.minimum(p, p.pow(2)) * pos
        p.data.add_(step.to(torch.float64).float(), alpha=-lr)

    params = make_params([(37, 19), (1000,)])
    d = {"lr": 0.01, "eps": 1e-8}
    got, opt = captured(kitchen, params, d, 5)
    want = eager(kitchen, params, d, 5)
    assert len(keys(opt)) == 1
    for x, y in zip(got, want):
        assert torch.allclose(x, y, rtol=1e-5, atol=1e-6)
    assert max_abs(got, params) > 1e-3


# ---- errors ------------------------------------------------------------------------------------
def _error(fn, defaults=None, params=None) -> str:
    with pytest.raises(oft.CaptureError) as e:
        oft.from_rule(
            fn, params or [torch.zeros(4, 4, requires_grad=True)], defaults or {"lr": 0.1}
        )
    return str(e.value)


def test_an_unsupported_op_names_itself_its_line_and_what_is_accepted():
    def sigmoid_step(p, grad, *, lr):
        p.sub_(lr * torch.sigmoid(grad))

    msg = _error(sigmoid_step)
    assert "optfuse cannot capture sigmoid" in msg
    assert "test_capture.py:" in msg and "p.sub_(lr * torch.sigmoid(grad))" in msg
    assert "it may use add, sub" in msg and "lerp, addcmul, addcdiv" in msg

    def noisy(p, grad, *, lr):
        p.sub_(lr * (grad + torch.randn_like(grad)))

    assert "cannot capture randn_like" in _error(noisy)

    def flat(p, grad, *, lr):
        p.sub_(lr * grad.view(-1).view(p.shape))

    assert "cannot capture view" in _error(flat)


def test_a_scalar_made_a_python_number_is_an_error_at_its_line():
    def adam_math(p, grad, *, lr, step):
        p.sub_(lr / math.sqrt(1 - 0.999**step) * grad)

    msg = _error(adam_math)
    assert "math.sqrt(1 - 0.999**step)" in msg  # (the line as written)
    assert "write it with torch ops" in msg

    def branchy(p, grad, *, lr):
        if lr > 0:
            p.sub_(lr * grad)

    assert "if lr > 0:" in _error(branchy)


def test_other_capture_errors():
    def writes_grad(p, grad, *, lr):
        grad.mul_(lr)
        p.sub_(grad)

    assert "writes its gradient 'grad': the gradient is read-only" in _error(writes_grad)

    def columns(p, grad, *, lr):
        p.sub_(lr * (grad - grad.mean(dim=0, keepdim=True)))

    assert "reduction over dims [0]" in _error(columns)

    def no_keepdim(p, grad, *, lr):
        p.sub_(lr * grad.sum(dim=1).sum())

    assert "needs keepdim=True" in _error(no_keepdim)

    def unknown(p, grad, *, lr, beta):
        p.sub_(lr * beta * grad)

    assert "'beta' is neither an option in the defaults" in _error(unknown)

    scale = torch.tensor(0.5)

    def uses_a_global(p, grad, *, lr):
        p.sub_(lr * scale * grad)

    assert "neither an argument of the rule nor computed from them" in _error(uses_a_global)

    def made_here(p, grad, *, lr):  # a constant written in the rule is a constant
        p.sub_(lr * torch.tensor(0.5) * grad)

    oft.from_rule(made_here, [torch.zeros(2, requires_grad=True)], {"lr": 0.1})

    def nothing(p, grad, *, lr):
        return None

    assert "changes nothing" in _error(nothing)

    with pytest.raises(oft.CaptureError) as e:
        oft.from_rule(
            sgd_gc_inplace,
            [torch.zeros(2, 3, 4, requires_grad=True)],
            SGD_DEFAULTS,
            host_scalars=sgd_host_scalars,
        )
    msg = str(e.value)
    assert "shape (2, 3, 4)" in msg and "reduces per row" in msg
