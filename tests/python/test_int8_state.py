"""8-bit optimizer state (``state_dtype="int8"``, docs/int8-state.md) in the torch drop-in.

Oracle: torch.optim.AdamW itself. Before each step, torch's optimizer gets our state decoded
(with the maps as docs/int8-state.md writes them, in float64 here, then float32), takes the same
step, and its new moments are encoded again per block. Each step starts from our own previous
state, so a code that rounds the other way once does not carry over. Tolerances:
  * codes within one (our kernel computes in f32 and may land across a code boundary; torch's
    moments and ours differ by f32 rounding), and such codes rarer than 1e-3;
  * params within 1e-6 relative + 1e-9 (the same f32 step from the same decoded state; the
    decoded v itself is rounded a few times in f32 by each side).
"""

import io

import pytest
import torch

import optfuse.torch as oft
from conftest import grad_for

BLOCK = 256


def decode(codes, scales, block, sqrt_map):
    c = codes.reshape(-1).double()
    s = scales.double().repeat_interleave(block)[: c.numel()]
    if sqrt_map:
        return ((c * s.sqrt() / 255) ** 2).reshape(codes.shape)
    return ((c - 127) * s / 127).reshape(codes.shape)


def encode(x, scales, block, sqrt_map):
    x = x.reshape(-1).double()
    s = scales.double().repeat_interleave(block)[: x.numel()]
    safe = torch.where(s > 0, s, torch.ones_like(s))
    if sqrt_map:
        c = torch.floor(255 * (x / safe).sqrt() + 0.5)
    else:
        c = torch.floor(127 * x / safe + 127.5)
    return torch.where(s > 0, c, torch.full_like(c, 0 if sqrt_map else 127))


def block_max(x, block):
    x = x.reshape(-1).abs().double()
    pad = (-x.numel()) % block
    return torch.nn.functional.pad(x, (0, pad)).reshape(-1, block).amax(dim=1)


def expect_codes(codes, want, scales, block, sqrt_map, what):
    ref = encode(want, scales, block, sqrt_map)
    d = (codes.reshape(-1).double() - ref).abs()
    assert d.max().item() <= 1, what
    assert (d > 0).sum().item() <= codes.numel() // 1000 + 1, what


# 10000 = 39 blocks and a last one of 16; 300 stays below min_8bit_size (4096): f32 state.
SHAPES = [(100, 100), (8192,), (300,)]


def make(shapes=SHAPES, seed=0, **kw):
    g = torch.Generator().manual_seed(seed)
    ps = [torch.randn(s, generator=g).requires_grad_(True) for s in shapes]
    return ps, oft.AdamW(ps, lr=1e-3, weight_decay=1e-2, state_dtype="int8", **kw)


def test_each_step_matches_torch_from_the_held_state():
    ps, opt = make()
    for step in range(4):
        for k, p in enumerate(ps):
            p.grad = grad_for(p, step, k)
        refs, torch_opts = [], []
        for k, p in enumerate(ps[:2]):
            r = p.detach().clone().requires_grad_(True)
            r.grad = p.grad.clone()
            t = torch.optim.AdamW([r], lr=1e-3, weight_decay=1e-2)
            st = opt.state[p]
            if st:
                t.state[r] = {
                    "step": st["step"].clone(),
                    "exp_avg": decode(st["exp_avg"], st["exp_avg.absmax"], BLOCK, False).float(),
                    "exp_avg_sq": decode(
                        st["exp_avg_sq"], st["exp_avg_sq.absmax"], BLOCK, True
                    ).float(),
                }
            t.step()
            refs.append(r)
            torch_opts.append(t)
        opt.step()
        for k, (p, r, t) in enumerate(zip(ps, refs, torch_opts)):
            st, ts = opt.state[p], t.state[r]
            what = f"step {step} tensor {k}"
            assert st["exp_avg"].dtype == torch.uint8 and st["exp_avg"].shape == p.shape
            blocks = (p.numel() + BLOCK - 1) // BLOCK
            assert st["exp_avg.absmax"].shape == (blocks,)
            for name, sqrt_map in (("exp_avg", False), ("exp_avg_sq", True)):
                scales = st[name + ".absmax"]
                torch.testing.assert_close(
                    scales.double(), block_max(ts[name], BLOCK), rtol=2**-20, atol=0
                )
                expect_codes(st[name], ts[name], scales, BLOCK, sqrt_map, f"{what} {name}")
            torch.testing.assert_close(p.detach(), r.detach(), rtol=1e-6, atol=1e-9)
    small = opt.state[ps[2]]
    assert small["exp_avg"].dtype == torch.float32 and "exp_avg.absmax" not in small


def run(opt, ps, first, count):
    for step in range(first, first + count):
        for k, p in enumerate(ps):
            p.grad = grad_for(p, step, k)
        opt.step()


def test_state_dict_resumes_bit_identically():
    # The bits must agree: both runs call the same kernels on the same bytes (the codes and the
    # scales are the state; loading copies them, nothing is re-encoded).
    ps, opt = make(seed=1)
    run(opt, ps, 0, 3)
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    buf.seek(0)
    qs = [p.detach().clone().requires_grad_(True) for p in ps]
    opt2 = oft.AdamW(qs, lr=1e-3, weight_decay=1e-2, state_dtype="int8")
    opt2.load_state_dict(torch.load(buf))
    run(opt, ps, 3, 3)
    run(opt2, qs, 3, 3)
    for p, q in zip(ps, qs):
        assert torch.equal(p, q)
        for name, t in opt.state[p].items():
            assert torch.equal(t, opt2.state[q][name]), name


def test_state_dtype_and_block_size_changes_convert_the_state():
    ps, opt = make(shapes=[(10000,)], seed=2)
    p = ps[0]
    for g in opt.param_groups:
        g["state_dtype"] = "f32"
    run(opt, ps, 0, 2)
    m32 = opt.state[p]["exp_avg"].clone()
    opt.param_groups[0]["state_dtype"] = "int8"
    run(opt, ps, 2, 1)
    st = opt.state[p]
    got = decode(st["exp_avg"], st["exp_avg.absmax"], BLOCK, False)
    step_m = 0.9 * m32.double() + 0.1 * p.grad.double()
    # Two quantizations (the conversion, then the step's), each within half a code.
    bound = (2 * st["exp_avg.absmax"].double() / 254).repeat_interleave(BLOCK)[: p.numel()]
    assert ((got - step_m).abs() <= bound + 1e-9).all()
    opt.param_groups[0]["block_size"] = 64
    run(opt, ps, 3, 1)
    assert opt.state[p]["exp_avg.absmax"].shape == ((10000 + 63) // 64,)
    opt.param_groups[0]["state_dtype"] = "bf16"
    run(opt, ps, 4, 1)
    assert opt.state[p]["exp_avg"].dtype == torch.bfloat16
    assert "exp_avg.absmax" not in opt.state[p]


def test_bad_options_name_the_value():
    ps, opt = make(shapes=[(4096,)])
    opt.param_groups[0]["block_size"] = 100
    ps[0].grad = torch.ones_like(ps[0])
    with pytest.raises(Exception, match="block_size.*multiple of 16"):
        opt.step()


def test_checkpoint_without_scales_is_refused_and_changes_nothing():
    ps, opt = make(shapes=[(10000,), (8192,)], seed=3)
    run(opt, ps, 0, 2)
    sd = opt.state_dict()
    del sd["state"][1]["exp_avg.absmax"]
    qs = [p.detach().clone().requires_grad_(True) for p in ps]
    opt2 = oft.AdamW(qs, lr=1e-3, weight_decay=1e-2, state_dtype="int8")
    opt2.load_state_dict(sd)
    before = {k: v.clone() for k, v in opt2.state[qs[0]].items()}
    for k, q in enumerate(qs):
        q.grad = grad_for(q, 2, k)
    with pytest.raises(ValueError, match="'exp_avg' has no scales"):
        opt2.step()
    assert all(torch.equal(before[k], opt2.state[qs[0]][k]) for k in before)
    assert torch.equal(qs[0], ps[0])


def test_a_failed_block_size_change_changes_no_tensor():
    ps, opt = make(shapes=[(10000,), (8192,)], seed=4)
    run(opt, ps, 0, 2)
    opt.state[ps[1]]["exp_avg.absmax"] = torch.zeros(3)  # damaged: 32 blocks needed
    held = [opt.state[p]["exp_avg.absmax"].shape for p in ps]
    opt.param_groups[0]["block_size"] = 64
    for k, p in enumerate(ps):
        p.grad = grad_for(p, 2, k)
    with pytest.raises(ValueError, match="exp_avg.absmax' has 3"):
        opt.step()
    assert [opt.state[p]["exp_avg.absmax"].shape for p in ps] == held
