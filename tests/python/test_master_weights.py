"""16-bit params without master weights (``master_weights=False``): torch's own way.

The reference is torch itself: ``torch.optim.AdamW(fused=True)`` / ``Adam(fused=True)`` on the same
bf16 or f16 params, whose CPU kernel (aten/src/ATen/native/cpu/FusedAdamKernel.cpp, adam_math)
widens param, grad and state to f32, computes the update in f32 and rounds param and moments once
to the param's dtype. optfuse's unmastered Adam graph is written in the op order of that kernel's
vector loop (src/optim/adam.cpp), so:

* Every element torch's vector loop updates gets torch's bits, every step: params and both
  moments compared with torch.equal. (The one exception allowed by the construction, a double
  rounding in exp_avg_sq's f64 multiply-add, has probability about 2^-28 per value; these runs
  round a few 10^7.) Adam is element-wise, so these elements never depend on the others.
* The last n mod W elements of each tensor (W = 32 16-bit lanes with AVX-512, 16 otherwise) go
  through torch's scalar loop, which its compiler contracts differently (v*beta2 into the
  multiply-add, p*decay - u as one FMA). There each value is, from the same inputs, within one
  f32 rounding of ours before both round to 16 bits, so the 16-bit results differ by at most one
  16-bit ulp. Checked per step from torch's own values (ours are reset to torch's after each step,
  as a new start from the same inputs).
"""

import copy

import pytest
import torch

import optfuse.torch as oft
from conftest import grad_for, make_params

# Ragged sizes: below one vector, a partial last vector, several tasks.
SHAPES = [(37, 19), (1000,), (3, 5, 7), (1,), (129, 65), (200, 101), (70001,)]
# Sizes with no scalar tail in torch (multiples of 32 elements).
WHOLE = [(64, 32), (1024,), (96,)]
TORCH_LANES = 32 if "AVX512" in torch.backends.cpu.get_cpu_capability() else 16


def ulp16(x):
    """The spacing of x's 16-bit dtype at |x| (for bf16 8 significant bits, f16 11, above the
    f16 subnormals, where it is 2^-24)."""
    bits, low = (8, -133) if x.dtype == torch.bfloat16 else (11, -24)
    e = torch.frexp(x.float().abs().clamp_min(2.0**-126))[1]
    return torch.ldexp(torch.ones_like(x, dtype=torch.float32), (e - bits).clamp_min(low))


def compare(ours, ref, where):
    """Body bit for bit; the scalar tail within one 16-bit ulp, then reset to torch's."""
    o, r = ours.view(-1), ref.view(-1)
    body = r.numel() - r.numel() % TORCH_LANES
    assert torch.equal(o[:body], r[:body]), f"{where}: {differ(o[:body], r[:body])}"
    tail_o, tail_r = o[body:].float(), r[body:].float()
    assert ((tail_o - tail_r).abs() <= ulp16(r[body:])).all(), f"{where} (tail)"
    o[body:] = r[body:]


def twins(dtype, make_ref, make_ours, steps, shapes=SHAPES, spoil=None, compare=compare):
    """Runs torch's optimizer and optfuse's on the same 16-bit params and gradients, comparing
    params and state after every step (see the top of this file). `spoil(g, step)` changes a
    gradient in place before both see it."""
    p0 = [p.to(dtype) for p in make_params(shapes=shapes)]
    ref = [p.clone().requires_grad_() for p in p0]
    ours = [p.clone().requires_grad_() for p in p0]
    a, b = make_ref(ref), make_ours(ours)
    for step in range(steps):
        for k, (r, o) in enumerate(zip(ref, ours)):
            g = grad_for(r, step, k)
            if spoil is not None:
                spoil(g, step)
            r.grad = g.clone()
            o.grad = g.clone()
        a.step()
        b.step()
        with torch.no_grad():
            for k, (r, o) in enumerate(zip(ref, ours)):
                compare(o, r, f"step {step}, param {k}")
                for name, t in a.state[r].items():
                    u = b.state[o][name]
                    assert u.dtype == t.dtype, name
                    if name == "step":
                        assert torch.equal(u, t)
                    else:
                        compare(u, t, f"step {step}, param {k}, {name}")
    return a, b, ref, ours


def differ(x, y):
    d = (x != y).sum().item()
    return f"{d} of {x.numel()} elements differ, max |diff| {(x.float() - y.float()).abs().max()}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_adamw_matches_torch_fused_bit_for_bit(dtype):
    a, b, ref, ours = twins(
        dtype,
        lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1, fused=True),
        lambda ps: oft.AdamW(ps, lr=1e-2, weight_decay=0.1, master_weights=False),
        steps=100,
    )
    # torch's state layout, no master copy: 14 bytes per element in bf16.
    assert set(b.state[ours[0]]) == set(a.state[ref[0]]) == {"step", "exp_avg", "exp_avg_sq"}
    assert b.state[ours[0]]["exp_avg"].dtype == dtype


def compare_nans(ours, ref, where):
    """NaNs at the same elements (their payloads are each library's own: torch's vector loop
    writes one of its own, optfuse keeps the operand's, quiet); every other element bit for bit."""
    o, r = ours.view(-1), ref.view(-1)
    assert torch.equal(o.isnan(), r.isnan()), f"{where}: NaNs at other elements"
    assert torch.equal(o[~o.isnan()], r[~r.isnan()]), f"{where}: {differ(o, r)}"


def test_adamw_with_nan_and_inf_grads_matches_torch_fused():
    """Gradients with NaNs and infinities in a few elements (a bad batch, an overflowed loss
    scale): the elements they reach become NaN or infinite here as in torch, every other keeps
    torch's bits. On CPUs without AVX512-BF16 the NaN lanes take the kernel's NaN path
    (src/lower/one_nan_test.h); sizes without torch's scalar tail, so all elements compare."""

    def spoil(g, step):
        flat = g.view(-1)
        flat[step % 7 :: 97] = float("nan")
        flat[(step + 3) % 11 :: 89] = float("inf")
        flat[(step + 5) % 13 :: 131] = -float("inf")

    twins(
        torch.bfloat16,
        lambda ps: torch.optim.AdamW(ps, lr=1e-2, weight_decay=0.1, fused=True),
        lambda ps: oft.AdamW(ps, lr=1e-2, weight_decay=0.1, master_weights=False),
        steps=12,
        shapes=WHOLE,
        spoil=spoil,
        compare=compare_nans,
    )


@pytest.mark.parametrize(
    "kwargs",
    [dict(amsgrad=True), dict(maximize=True, weight_decay=0.0), dict(betas=(0.8, 0.95), eps=1e-6)],
)
def test_adam_variants_match_torch_fused_bit_for_bit(kwargs):
    twins(
        torch.bfloat16,
        lambda ps: torch.optim.Adam(ps, lr=1e-3, fused=True, **kwargs),
        lambda ps: oft.Adam(ps, lr=1e-3, master_weights=False, **kwargs),
        steps=60,
    )


def test_adam_l2_weight_decay_matches_torch_fused_bit_for_bit():
    twins(
        torch.bfloat16,
        lambda ps: torch.optim.Adam(ps, lr=1e-3, weight_decay=0.01, fused=True),
        lambda ps: oft.Adam(ps, lr=1e-3, weight_decay=0.01, master_weights=False),
        steps=60,
    )


def test_lr_schedule_matches_torch_fused():
    def sched(opt):
        return torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=40)

    p0 = [p.bfloat16() for p in make_params(shapes=WHOLE)]
    ref = [p.clone().requires_grad_() for p in p0]
    ours = [p.clone().requires_grad_() for p in p0]
    a = torch.optim.AdamW(ref, lr=3e-3, fused=True)
    b = oft.AdamW(ours, lr=3e-3, master_weights=False)
    sa, sb = sched(a), sched(b)
    for step in range(40):
        for k, (r, o) in enumerate(zip(ref, ours)):
            r.grad = grad_for(r, step, k)
            o.grad = r.grad.clone()
        a.step()
        b.step()
        sa.step()
        sb.step()
    assert all(torch.equal(o, r) for o, r in zip(ours, ref))


def test_torch_checkpoint_loads_and_continues_identically():
    """A torch bf16 AdamW(fused=True) checkpoint taken mid-run continues in optfuse exactly as in
    torch, and optfuse's state_dict loads back into torch (the layouts are one). Sizes without
    torch's scalar tail, so every element is exact."""
    p0 = [p.bfloat16() for p in make_params(shapes=WHOLE)]
    ref = [p.clone().requires_grad_() for p in p0]
    a = torch.optim.AdamW(ref, lr=1e-2, fused=True)

    def steps(opt, ps, first, last):
        for step in range(first, last):
            for k, p in enumerate(ps):
                p.grad = grad_for(p, step, k)
            opt.step()

    steps(a, ref, 0, 20)
    ours = [p.detach().clone().requires_grad_() for p in ref]
    b = oft.AdamW(ours, lr=1e-2, master_weights=False)
    # (a deep copy: torch's load keeps a fused optimizer's 'step' tensors, shared with `a`)
    b.load_state_dict(copy.deepcopy(a.state_dict()))
    steps(a, ref, 20, 40)
    steps(b, ours, 20, 40)
    assert all(torch.equal(o, r) for o, r in zip(ours, ref))
    sd = b.state_dict()
    assert "master" not in sd["state"][0]
    back = [p.detach().clone().requires_grad_() for p in ours]
    c = torch.optim.AdamW(back, lr=1e-2, fused=True)
    c.load_state_dict(copy.deepcopy(sd))
    steps(a, ref, 40, 50)
    steps(c, back, 40, 50)
    assert all(torch.equal(x, r) for x, r in zip(back, ref))


def test_master_weights_off_drops_the_copy_and_on_remakes_it():
    """Turning master weights off mid-run drops state["master"] (the param is the value); turning
    them back on makes a new copy from the param, never the stale one."""
    p = torch.randn(300).bfloat16().requires_grad_()
    opt = oft.AdamW([p], lr=1e-2, master_weights=True)
    p.grad = torch.randn(300).bfloat16()
    opt.step()
    assert opt.state[p]["master"].dtype == torch.float32
    opt.param_groups[0]["master_weights"] = False
    opt.step()
    assert "master" not in opt.state[p]
    assert opt.state[p]["exp_avg"].dtype == torch.bfloat16
    opt.param_groups[0]["master_weights"] = True
    opt.step()
    # The new master is the param of the step before, updated once in f32: it rounds to p.
    assert torch.equal(opt.state[p]["master"].bfloat16(), p.detach())


def test_f32_params_are_unaffected():
    """f32 params have no master copy to drop: master_weights=False is the same kernel and the
    same bits as the default."""
    p0 = make_params()
    x = [p.clone().requires_grad_() for p in p0]
    y = [p.clone().requires_grad_() for p in p0]
    a, b = oft.AdamW(x, lr=1e-2), oft.AdamW(y, lr=1e-2, master_weights=False)
    for step in range(10):
        for k, (u, v) in enumerate(zip(x, y)):
            u.grad = grad_for(u, step, k)
            v.grad = u.grad.clone()
        a.step()
        b.step()
    assert all(torch.equal(u, v) for u, v in zip(x, y))
    assert b.state[y[0]]["exp_avg"].dtype == torch.float32


def bf16_ulp(x):
    """The spacing of bf16 values at |x| (8 significant bits)."""
    e = torch.frexp(x.float().abs().clamp_min(2**-126))[1]
    return torch.ldexp(torch.ones_like(x, dtype=torch.float32), e - 8)


def test_sgd_without_master_weights_rounds_the_f32_step_once():
    """Optimizers other than Adam / AdamW keep their own op order without master weights (torch
    has no fused CPU twin for them to match). Each step must still be the f32 update of the bf16
    values, rounded once: the reference computes it in f32 from our own bf16 state of the step
    before (so no drift) and rounds it. The two f32 values differ by a few f32 ulps of the terms
    summed (op order; FMA contraction, which skips one product's rounding), so the roundings
    agree within one bf16 ulp of the result plus 4 f32 ulps (2^-21) of the terms' magnitudes:
    where the terms cancel (momentum * buf == -grad) the result is 0 in the reference and a
    residue of that size with an FMA."""
    p0 = [p.bfloat16() for p in make_params()]
    ours = [p.clone().requires_grad_() for p in p0]
    lr, mom = 1e-2, 0.9
    b = oft.SGD(ours, lr=lr, momentum=mom, master_weights=False)
    for step in range(20):
        before = [
            (o.detach().float(), b.state[o]["momentum_buffer"].float() if step else None)
            for o in ours
        ]
        for k, o in enumerate(ours):
            o.grad = grad_for(o, step, k)
        b.step()
        for k, (o, (p32, m32)) in enumerate(zip(ours, before)):
            g = o.grad.float()
            m_ref = g if m32 is None else mom * m32 + g
            m_terms = g.abs() if m32 is None else (mom * m32).abs() + g.abs()
            p_ref = p32 - lr * m_ref
            p_terms = p32.abs() + (lr * m_ref).abs()
            m_new = b.state[o]["momentum_buffer"]
            assert m_new.dtype == torch.bfloat16 and "master" not in b.state[o]
            m_bound = bf16_ulp(m_ref) + m_terms * 2.0**-21
            assert ((m_new.float() - m_ref.bfloat16().float()).abs() <= m_bound).all()
            p_bound = bf16_ulp(p_ref) + p_terms * 2.0**-21
            assert ((o.detach().float() - p_ref.bfloat16().float()).abs() <= p_bound).all()


def test_errors_name_the_option():
    p = torch.randn(10).half().requires_grad_()
    opt = oft.AdamW([p], master_weights=False, state_dtype="bf16")
    p.grad = torch.randn(10).half()
    before = p.detach().clone()
    with pytest.raises(Exception, match="state_dtype .bf16. with master_weights false and f16"):
        opt.step()
    assert torch.equal(p.detach(), before)  # a refused step changes nothing
    q = torch.randn(3, requires_grad=True)
    with pytest.raises(ValueError, match="master_weights"):  # in the constructor, as torch's
        oft.AdamW([q], master_weights="no")
