"""Every layout and dtype torch's optimizers accept, and every bad one refused before any kernel
runs (python/src/torch_step.h): the cases of issue 31, each against torch.optim.AdamW itself.

Tolerances: float32 runs end within 2e-5 of torch after their steps (test_trajectories.py's
float32 bound for lr 1e-2); float64 runs within 1e-12 relative (both compute in double: a few ulp
per op, test_optim_f64.cpp); a refused step must leave every param and state byte as it was.
"""

import pytest
import torch

import optfuse.torch as oft
from conftest import max_abs

F32_TOL = 2e-5


def torch_twin(params, make_ours, make_ref, steps, mutate=None, layout=None):
    """Steps optfuse and torch on copies of `params` with the same gradients (in `layout(g)`'s
    layout when given); `mutate(ps)` runs on both sides after the first step (p.data = ...).
    Returns both sides' params."""
    ours = [p.detach().clone().requires_grad_() for p in params]
    ref = [p.detach().clone().requires_grad_() for p in params]
    a, b = make_ours(ours), make_ref(ref)
    for step in range(steps):
        if step == 1 and mutate is not None:
            with torch.no_grad():
                mutate(ours)
                mutate(ref)
        for k, (p, r) in enumerate(zip(ours, ref)):
            g = torch.Generator().manual_seed(100 * step + k)
            grad = torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype)
            shape = layout or (lambda t: t)
            p.grad, r.grad = shape(grad.clone()), shape(grad.clone())
        a.step()
        b.step()
    return ours, ref


def adamw(ps):
    return oft.AdamW(ps, lr=1e-2, weight_decay=0.1)


def torch_adamw(ps):
    return torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1)


def test_channels_last_conv_weights_match_torch():
    conv = torch.randn(8, 3, 5, 5).to(memory_format=torch.channels_last)
    assert not conv.is_contiguous()

    def channels_last(g):
        return g.contiguous(memory_format=torch.channels_last) if g.dim() == 4 else g

    ours, ref = torch_twin([conv, torch.randn(8)], adamw, torch_adamw, 5, layout=channels_last)
    assert max_abs(ours, ref) < F32_TOL
    assert ours[0].is_contiguous(memory_format=torch.channels_last)  # updated in place
    assert max_abs(ours, [conv, torch.zeros(8)]) > 1e-3


def test_a_transposed_param_is_updated_in_its_layout():
    # p.data = p.data.t() between steps (a square matrix: the state still fits), as torch does.
    ours, ref = torch_twin(
        [torch.randn(16, 16), torch.randn(5, 3)],
        adamw,
        torch_adamw,
        4,
        mutate=lambda ps: setattr(ps[0], "data", ps[0].data.t()),
    )
    assert not ours[0].is_contiguous()
    assert max_abs(ours, ref) < F32_TOL


def test_gradients_in_another_dim_order_match_torch():
    ours, ref = torch_twin(
        [torch.randn(6, 9), torch.randn(40)],
        adamw,
        torch_adamw,
        4,
        layout=lambda g: g.t().contiguous().t() if g.dim() == 2 else g,
    )
    assert max_abs(ours, ref) < F32_TOL


def test_an_expanded_gradient_matches_torch():
    # A stride-0 gradient (what expand() gives, e.g. from a broadcast in backward): read through
    # a copy, its elements overlapping in memory.
    def expanded(g):
        e = g[:1].expand(7, 5)
        assert e.stride() == (0, 1)
        return e

    ours, ref = torch_twin([torch.randn(7, 5)], adamw, torch_adamw, 3, layout=expanded)
    assert ours[0].grad.stride() == (0, 1)
    assert max_abs(ours, ref) < F32_TOL


def test_a_param_with_gaps_matches_torch():
    def gapped(ps):  # a view with gaps (strides (40, 2)): it steps through a contiguous copy
        ps[0].data = ps[0].data.repeat(1, 2)[:, ::2]

    ours, ref = torch_twin([torch.randn(12, 20)], adamw, torch_adamw, 4, mutate=gapped)
    assert ours[0].stride() == (40, 2)
    assert max_abs(ours, ref) < F32_TOL


def test_float64_params_match_torch():
    params = [torch.randn(37, 19, dtype=torch.float64), torch.randn(1000, dtype=torch.float64)]
    for make, make_ref in (
        (adamw, torch_adamw),
        (
            lambda ps: oft.SGD(ps, lr=0.05, momentum=0.9, nesterov=True),
            lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True),
        ),
        (lambda ps: oft.Adagrad(ps, lr=0.05), lambda ps: torch.optim.Adagrad(ps, lr=0.05)),
    ):
        ours, ref = torch_twin(params, make, make_ref, 10)
        assert all(p.dtype == torch.float64 for p in ours)
        rel = max(((a - b).abs().max() / b.abs().max()).item() for a, b in zip(ours, ref))
        assert rel < 1e-12, rel


def test_a_group_mixing_dtypes_runs_one_kernel_per_dtype():
    f32, f64 = torch.randn(40, 7), torch.randn(300, dtype=torch.float64)
    bf16 = torch.randn(64).to(torch.bfloat16)
    ours, ref = torch_twin(
        [f32, f64, bf16],
        lambda ps: oft.AdamW(ps, lr=1e-2, master_weights=False),
        lambda ps: torch.optim.AdamW(ps, lr=1e-2, fused=True),
        5,
    )
    assert max_abs(ours[:1], ref[:1]) < F32_TOL
    assert ((ours[1] - ref[1]).abs().max() / ref[1].abs().max()).item() < 1e-12
    # bf16 without master weights is torch's fused step: within one bf16 ulp per step.
    assert max_abs(ours[2:], ref[2:]) <= 5 * 2**-7 * ref[2].abs().max().item()
    opt = oft.AdamW([p.detach().clone().requires_grad_() for p in (f32, f64, bf16)])
    for p in opt.param_groups[0]["params"]:
        p.grad = torch.ones_like(p)
    opt.step()
    assert opt._optfuse_binding.core.num_groups() == 3  # one C++ group (kernel) per dtype


def stepped(n=4096):
    ps = [torch.randn(n, requires_grad=True), torch.randn(10, 10, requires_grad=True)]
    opt = oft.AdamW(ps, lr=1e-2)
    for p in ps:
        p.grad = torch.randn_like(p)
    opt.step()
    return ps, opt


def snapshot(ps, opt):
    return (
        [p.detach().clone() for p in ps],
        [{k: v.clone() for k, v in opt.state[p].items()} for p in ps],
    )


def unchanged(ps, opt, snap):
    params, states = snap
    return all(torch.equal(a, b) for a, b in zip(ps, params)) and all(
        torch.equal(v, opt.state[p][k]) for p, st in zip(ps, states) for k, v in st.items()
    )


BAD_GRADS = [
    # (how the gradient goes wrong, what the error names)
    (
        "a smaller gradient",
        lambda p: setattr(p.grad, "data", torch.randn(p.numel() // 2)),
        r"param group 0, param 0 .*the gradient has shape \(2048,\), the param \(4096,\)",
    ),
    (
        "another dtype",
        lambda p: setattr(p.grad, "data", p.grad.data.double()),
        r"param group 0, param 0 .*the gradient is torch.float64",
    ),
    (
        "a sparse gradient",
        lambda p: setattr(p, "grad", p.grad.to_sparse()),
        r"param group 0, param 0 .*sparse",
    ),
]


@pytest.mark.parametrize("what,spoil,message", BAD_GRADS, ids=[c[0] for c in BAD_GRADS])
def test_a_bad_gradient_is_a_value_error_and_nothing_changes(what, spoil, message):
    ps, opt = stepped()
    snap = snapshot(ps, opt)
    ps[1].grad = torch.randn(10, 10)
    spoil(ps[0])
    with pytest.raises(ValueError, match=message):
        opt.step()
    assert unchanged(ps, opt, snap)


def test_a_resized_param_is_a_value_error_and_nothing_changes():
    ps, opt = stepped()
    snap = snapshot(ps[1:], opt)
    with torch.no_grad():
        ps[0].data = torch.zeros(50)
    ps[0].grad = torch.ones(50)
    with pytest.raises(ValueError, match=r"param group 0, param 0 .*was resized"):
        opt.step()
    assert unchanged(ps[1:], opt, snap) and torch.equal(ps[0], torch.zeros(50))


def test_a_huge_param_with_a_small_gradient_is_refused_not_read_past():
    # (On a 64M-element param this read past the gradient's end and crashed.)
    p = torch.zeros(1 << 22, requires_grad=True)
    opt = oft.SGD([p], lr=0.1)
    p.grad = torch.ones(1 << 22)
    opt.step()
    p.grad.data = torch.ones(16)
    with pytest.raises(ValueError, match=r"the gradient has shape \(16,\)"):
        opt.step()
    assert torch.equal(p.detach(), torch.full((1 << 22,), -0.1))


def test_a_checkpoint_without_a_state_is_refused_naming_it():
    ps, opt = stepped()
    sd = opt.state_dict()
    del sd["state"][0]["exp_avg_sq"]
    fresh = oft.AdamW([p.detach().clone().requires_grad_() for p in ps], lr=1e-2)
    fresh.load_state_dict(sd)
    for p in fresh.param_groups[0]["params"]:
        p.grad = torch.ones_like(p)
    before = [p.detach().clone() for p in fresh.param_groups[0]["params"]]
    with pytest.raises(KeyError, match="param group 0, param 0 .*'exp_avg_sq'"):
        fresh.step()
    assert all(torch.equal(a, b) for a, b in zip(before, fresh.param_groups[0]["params"]))
    # torch raises too (a KeyError at its step): the same checkpoint is refused both ways.
    theirs = torch.optim.AdamW([p.detach().clone().requires_grad_() for p in ps], lr=1e-2)
    theirs.load_state_dict(sd)
    for p in theirs.param_groups[0]["params"]:
        p.grad = torch.ones_like(p)
    with pytest.raises(KeyError):
        theirs.step()


@pytest.mark.parametrize(
    "kw,message",
    [
        (dict(max_grad_norm=-1.0), "max_grad_norm"),
        (dict(loss_scale="yes"), "loss_scale"),
        (dict(state_dtype="fp8"), "state_dtype"),
        (dict(accumulation_steps=0), "accumulation_steps"),
    ],
)
def test_optfuse_options_are_validated_in_the_constructor(kw, message):
    with pytest.raises(ValueError, match=message):
        oft.AdamW([torch.zeros(3, requires_grad=True)], **kw)


def test_a_bad_option_in_a_group_added_later_is_refused_there():
    opt = oft.AdamW([torch.zeros(3, requires_grad=True)])
    with pytest.raises(ValueError, match="state_dtype"):
        opt.add_param_group({"params": [torch.zeros(2, requires_grad=True)], "state_dtype": "fp8"})
