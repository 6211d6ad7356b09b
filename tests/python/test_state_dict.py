"""Checkpoints move both ways between torch.optim and optfuse.torch, in torch's own layout.

A run of 30 steps, saved, loaded into the other library's optimizer and continued for 30 more,
must end where the uninterrupted torch run ends, within the float32 bound of
test_trajectories.py (the two implementations round differently; the state carried over is the
same tensors).
"""

import io

import pytest
import torch

import optfuse.torch as oft
from conftest import grad_for, make_params, max_abs

CASES = [
    ("AdamW", dict(lr=1e-2, weight_decay=0.1)),
    ("Adam", dict(lr=1e-2, amsgrad=True)),
    ("SGD", dict(lr=1e-2, momentum=0.9, nesterov=True)),
    ("Adagrad", dict(lr=1e-2)),
    ("RMSprop", dict(lr=1e-3, centered=True, momentum=0.9)),
    ("Adamax", dict(lr=1e-2)),
    ("NAdam", dict(lr=1e-2)),
    ("RAdam", dict(lr=1e-2)),
    ("Adadelta", dict(lr=1.0)),
    ("ASGD", dict(lr=1e-2, t0=10.0)),  # eta, mu and ax all carried over mid-averaging
    ("Rprop", dict(lr=1e-3)),
    ("Adafactor", dict(lr=1e-2, weight_decay=1e-2)),
]  # row_var / col_var: [..., R, 1] ...


def steps(opt, ps, first, count):
    for step in range(first, first + count):
        for k, p in enumerate(ps):
            p.grad = grad_for(p, step, k)
        opt.step()
        opt.zero_grad()


def roundtrip(sd):
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    return torch.load(buf)


@pytest.mark.parametrize("name,kw", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("direction", ["torch_to_optfuse", "optfuse_to_torch"])
def test_resume_across_libraries(name, kw, direction):
    p0 = make_params()
    t_cls, o_cls = getattr(torch.optim, name), getattr(oft, name)
    first, second = (t_cls, o_cls) if direction == "torch_to_optfuse" else (o_cls, t_cls)

    ref = [p.clone().requires_grad_() for p in p0]
    steps(t_cls(ref, **kw), ref, 0, 60)

    ps = [p.clone().requires_grad_() for p in p0]
    a = first(ps, **kw)
    steps(a, ps, 0, 30)
    sd = roundtrip(a.state_dict())
    b = second(ps, **kw)
    b.load_state_dict(sd)
    steps(b, ps, 30, 30)
    assert max_abs(ps, ref) < 2e-5
    # Same layout: state names per param, and step counts.
    st = b.state_dict()["state"]
    assert sorted(st) == list(range(len(p0)))
    if name != "SGD":
        assert all(s["step"].item() == 60 for s in st.values())


def test_layout_is_torchs():
    p0 = make_params()
    ps1 = [p.clone().requires_grad_() for p in p0]
    ps2 = [p.clone().requires_grad_() for p in p0]
    a = torch.optim.AdamW(ps1, lr=1e-3)
    b = oft.AdamW(ps2, lr=1e-3)
    steps(a, ps1, 0, 2)
    steps(b, ps2, 0, 2)
    sa, sb = a.state_dict(), b.state_dict()
    assert sa["param_groups"] == sb["param_groups"]
    for k in sa["state"]:
        assert sorted(sa["state"][k]) == sorted(sb["state"][k])
        for name, v in sa["state"][k].items():
            assert v.dtype == sb["state"][k][name].dtype and v.shape == sb["state"][k][name].shape


def test_state_aliases_the_kernels_buffers():
    """optimizer.state[p] holds the buffers the kernels write: no copy."""
    p = torch.randn(1000, requires_grad=True)
    opt = oft.Adam([p], lr=1e-2)
    p.grad = torch.ones(1000)
    opt.step()
    m = opt.state[p]["exp_avg"]
    ptr = m.data_ptr()
    before = m.clone()
    opt.step()
    assert m.data_ptr() == ptr and not torch.equal(m, before)
    assert opt.state[p]["step"].item() == 2


def test_resume_in_the_same_library_is_bit_identical():
    """optfuse -> optfuse: the same kernels see the same state, so the bits must agree."""
    p0 = make_params()
    ref = [p.clone().requires_grad_() for p in p0]
    steps(oft.AdamW(ref, lr=1e-2), ref, 0, 20)
    ps = [p.clone().requires_grad_() for p in p0]
    a = oft.AdamW(ps, lr=1e-2)
    steps(a, ps, 0, 10)
    b = oft.AdamW(ps, lr=1e-2)
    b.load_state_dict(roundtrip(a.state_dict()))
    steps(b, ps, 10, 10)
    assert all(torch.equal(x, y) for x, y in zip(ps, ref))


def test_bf16_params_keep_their_f32_master_through_a_checkpoint():
    p = torch.randn(4096).to(torch.bfloat16).requires_grad_()
    a = oft.AdamW([p], lr=1e-3)
    for s in range(3):
        p.grad = grad_for(p, s, 0)
        a.step()
    master = a.state[p]["master"].clone()
    assert master.dtype == torch.float32
    b = oft.AdamW([p], lr=1e-3)
    b.load_state_dict(roundtrip(a.state_dict()))
    assert torch.equal(b.state[p]["master"], master)


def test_step_options_survive_load_state_dict():
    # torch's load_state_dict rebuilds the optimizer through __setstate__ with only "state" and
    # "param_groups"; the clip threshold is configuration, not checkpoint, and must still apply.
    ps = make_params([(8, 5), (7,)], seed=3)
    opt = oft.AdamW(ps, lr=1e-2, max_grad_norm=1e-3)
    steps(opt, ps, 0, 2)
    assert opt.last_step["total_norm"] is not None
    opt.load_state_dict(opt.state_dict())
    steps(opt, ps, 2, 1)
    assert opt.last_step["total_norm"] is not None  # still clipping: the norm was computed
