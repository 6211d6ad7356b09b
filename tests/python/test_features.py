"""torch.optim behaviour user code relies on, and optfuse's fused step features, each checked
against torch doing the same thing (bounds as in test_trajectories.py unless stated)."""

import pytest
import torch
from torch.optim.optimizer import (
    register_optimizer_step_post_hook,
    register_optimizer_step_pre_hook,
)

import optfuse.torch as oft
from conftest import grad_for, lockstep, make_params, max_abs


def pair(p0):
    return ([p.clone().requires_grad_() for p in p0], [p.clone().requires_grad_() for p in p0])


def test_params_without_grad_are_skipped_as_torch_skips_them():
    p0 = make_params()
    ref, ours = pair(p0)
    a, b = torch.optim.AdamW(ref, lr=1e-2), oft.AdamW(ours, lr=1e-2)
    for step in range(30):
        for k, (r, o) in enumerate(zip(ref, ours)):
            has = not (k == 1 and step < 10) and not (k == 3 and step % 3 == 0)
            r.grad = grad_for(r, step, k) if has else None
            o.grad = grad_for(o, step, k) if has else None
        a.step()
        b.step()
        if step == 5:
            assert ours[1] not in b.state or not b.state[ours[1]]
            assert torch.equal(ours[1], p0[1])
    assert max_abs(ours, ref) < 2e-5
    assert b.state[ours[3]]["step"].item() == a.state[ref[3]]["step"].item() == 20


def test_add_param_group_mid_run():
    p0 = make_params()
    ref, ours = pair(p0)
    a = torch.optim.SGD(ref[:2], lr=1e-2, momentum=0.9)
    b = oft.SGD(ours[:2], lr=1e-2, momentum=0.9)
    for step in range(20):
        if step == 10:
            a.add_param_group({"params": ref[2:], "lr": 5e-3})
            b.add_param_group({"params": ours[2:], "lr": 5e-3})
        n = 2 if step < 10 else len(p0)
        for k in range(n):
            ref[k].grad = grad_for(ref[k], step, k)
            ours[k].grad = grad_for(ours[k], step, k)
        a.step()
        b.step()
    assert max_abs(ours, ref) < 2e-5


def test_step_hooks_fire():
    p = torch.randn(10, requires_grad=True)
    opt = oft.Adam([p])
    seen = []
    opt.register_step_pre_hook(lambda o, args, kwargs: seen.append("pre"))
    opt.register_step_post_hook(lambda o, args, kwargs: seen.append("post"))
    p.grad = torch.ones(10)
    opt.step()
    assert seen == ["pre", "post"]


def test_global_step_hooks_and_the_profiler_range():
    # optfuse's step() skips torch's wrapper when nothing would see it: the global hooks, a
    # capturing rule's step and a profiler must still each see one step.
    seen = []
    handles = [
        register_optimizer_step_pre_hook(lambda o, a, k: seen.append("pre")),
        register_optimizer_step_post_hook(lambda o, a, k: seen.append("post")),
    ]
    try:
        p = torch.randn(10, requires_grad=True)
        p.grad = torch.ones(10)
        oft.AdamW([p]).step()
        assert seen == ["pre", "post"]
    finally:
        for h in handles:
            h.remove()
    p.grad = torch.ones(10)
    opt = oft.AdamW([p])
    opt.step()  # binds outside the profiler
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        opt.step()
    names = [e.name for e in prof.events()]
    assert names.count("Optimizer.step#AdamW.step") == 1, names
    assert opt.last_step["outcome"] == "applied"


def test_step_in_grad_mode_leaves_no_graph():
    # step() does not run under Python's no_grad: C++ turns grad mode off for the copies it
    # makes. A param that is a view with gaps is staged: copied into a dense tensor for the
    # kernels and back after them, an in-place copy into a leaf that requires grad, which grad
    # mode refuses.
    p = torch.nn.Parameter(torch.randn(8, 3))
    p.data = p.data.repeat(1, 2)[:, ::2]
    ref = torch.nn.Parameter(p.detach().clone())
    g = torch.randn(8, 3)
    p.grad, ref.grad = g.clone(), g.clone()
    with torch.enable_grad():
        oft.SGD([p], lr=0.1).step()
    torch.optim.SGD([ref], lr=0.1).step()
    assert p.grad_fn is None and p.is_leaf and not p.is_contiguous()
    # SGD without momentum is p - lr * g in both: one rounding each, the same bits.
    assert torch.equal(p.detach(), ref.detach())


def test_max_grad_norm_is_clip_grad_norm_then_step():
    p0 = make_params()
    ref, ours = pair(p0)
    a = torch.optim.AdamW(ref, lr=1e-2)
    b = oft.AdamW(ours, lr=1e-2, max_grad_norm=1.0)
    for step in range(30):
        for k, (r, o) in enumerate(zip(ref, ours)):
            r.grad = grad_for(r, step, k)
            o.grad = grad_for(o, step, k)
        norm = torch.nn.utils.clip_grad_norm_(ref, 1.0)
        a.step()
        b.step()
        # The norm is summed in double by optfuse, in float32 by torch: relative 1e-5.
        assert b.last_step["total_norm"] == pytest.approx(norm.item(), rel=1e-5)
    assert max_abs(ours, ref) < 2e-5


def test_gradient_accumulation_is_the_mean_of_the_micro_batches():
    p0 = make_params()
    ref, ours = pair(p0)
    a = torch.optim.Adam(ref, lr=1e-2)
    b = oft.Adam(ours, lr=1e-2, accumulation_steps=4)
    for step in range(40):
        for k, (r, o) in enumerate(zip(ref, ours)):
            g = grad_for(r, step, k)
            r.grad = g / 4 if r.grad is None else r.grad + g / 4
            o.grad = grad_for(o, step, k) if step % 4 != 3 else g.clone()
        b.step()
        if step % 4 == 3:
            a.step()
            a.zero_grad()
            assert b.last_step["outcome"] == "applied"
        else:
            assert b.last_step["outcome"] == "accumulated"
    # (the grads of one cycle depend on the params of its start in both runs)
    assert max_abs(ours, ref) < 2e-5


def test_dynamic_loss_scaling_skips_a_step_with_inf_and_changes_nothing():
    p = torch.randn(100, requires_grad=True)
    opt = oft.AdamW([p], lr=1e-2, loss_scale="dynamic", init_scale=1024.0)
    assert opt.loss_scale == 1024.0
    p.grad = torch.full((100,), 1024.0)
    opt.step()
    before = p.detach().clone()
    state = {k: v.clone() for k, v in opt.state[p].items()}
    p.grad = torch.full((100,), float("inf"))
    opt.step()
    assert opt.last_step["outcome"] == "skipped_nonfinite"
    assert torch.equal(p, before)
    assert all(torch.equal(v, opt.state[p][k]) for k, v in state.items())
    assert opt.loss_scale == 512.0


def test_grad_scaler_step_and_unscale_work_as_with_torch():
    torch.manual_seed(0)
    model_a = torch.nn.Linear(16, 4)
    model_b = torch.nn.Linear(16, 4)
    model_b.load_state_dict(model_a.state_dict())
    a = torch.optim.AdamW(model_a.parameters(), lr=1e-2)
    b = oft.AdamW(model_b.parameters(), lr=1e-2)
    sa = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    sb = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    x = torch.randn(32, 16)
    for step in range(20):
        for model, opt, scaler in ((model_a, a, sa), (model_b, b, sb)):
            opt.zero_grad()
            loss = model(x).pow(2).mean() * (1e36 if step == 7 else 1.0)  # step 7 overflows
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(opt)
            scaler.update()
    assert sa.get_scale() == sb.get_scale() < 2.0**10
    assert max_abs(list(model_b.parameters()), list(model_a.parameters())) < 2e-5


def test_grad_centralization_matches_its_definition():
    """GC (Yong et al. 2020): g - mean(g over all dims but the first), for tensors of >= 2 dims."""
    p0 = make_params()
    ref, ours = pair(p0)
    a = torch.optim.SGD(ref, lr=1e-2, momentum=0.9)
    b = oft.SGD(ours, lr=1e-2, momentum=0.9, grad_centralization=True)
    for step in range(20):
        for k, (r, o) in enumerate(zip(ref, ours)):
            g = grad_for(r, step, k)
            if g.dim() >= 2:
                g = g - g.mean(dim=tuple(range(1, g.dim())), keepdim=True)
            r.grad = g
            o.grad = grad_for(o, step, k)
        a.step()
        b.step()
    assert max_abs(ours, ref) < 2e-5


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_16bit_params_follow_an_f32_master_copy(dtype):
    """The reference is torch.optim.AdamW on an f32 copy, cast to the 16-bit dtype after every
    step. Both roundings are round-to-nearest-even of f32 values within the f32 bound above, so
    the 16-bit params agree except where the two masters straddle a rounding boundary: allow
    one 16-bit ulp (|p| < 4: 2^-5 for bf16 on values < 4, far less for f16)."""
    p0 = make_params(dtype=dtype)
    master = [p.float().requires_grad_() for p in p0]
    ours = [p.clone().requires_grad_() for p in p0]
    a, b = torch.optim.AdamW(master, lr=1e-2), oft.AdamW(ours, lr=1e-2)
    for step in range(30):
        for k, (m, o) in enumerate(zip(master, ours)):
            g = grad_for(o, step, k)
            m.grad = g.float()
            o.grad = g
        a.step()
        b.step()
    assert max_abs([b.state[o]["master"] for o in ours], master) < 2e-5
    assert all(o.dtype == dtype for o in ours)
    assert max_abs(ours, [m.detach().to(dtype) for m in master]) <= 2**-5
    # The param is the master rounded once (same master bits -> same 16-bit bits).
    assert all(torch.equal(o, b.state[o]["master"].to(dtype)) for o in ours)


def test_bf16_state():
    p0 = make_params()
    ref, ours = pair(p0)
    a = torch.optim.AdamW(ref, lr=1e-2)
    b = oft.AdamW(ours, lr=1e-2)
    for g in b.param_groups:
        g["state_dtype"] = "bf16"
    lockstep([(a, ref), (b, ours)], 30)
    assert b.state[ours[0]]["exp_avg"].dtype == torch.bfloat16
    # bf16 moments (8 significant bits) change each update by up to 2^-9 relative: 30 steps
    # of lr 1e-2 stay within 30 * 1e-2 * 2 * 2^-8.
    assert max_abs(ours, ref) < 30 * 1e-2 * 2 * 2**-8


def _transparent_huge_pages() -> bool:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return "[never]" not in f.read()
    except OSError:
        return False


@pytest.mark.skipif(not _transparent_huge_pages(), reason="no transparent huge pages here")
def test_new_state_asks_for_huge_pages():
    """The advice covers whole 2 MiB pages only, and a buffer given it holds what it is given."""
    from optfuse import _core

    t = torch.empty(8 << 20, dtype=torch.uint8)
    assert _core.advise_huge_pages(t.data_ptr(), t.nbytes)
    assert not _core.advise_huge_pages(t.data_ptr(), 4096)  # no whole huge page inside
    t.fill_(7)
    assert bool((t == 7).all())


def test_new_state_asks_for_huge_pages_only_when_told(monkeypatch):
    """New state is advised into huge pages with OPTFUSE_HUGE_PAGES=1 only (off by default: on
    some hosts it slows the first step down, include/optfuse/optim.h)."""
    from optfuse import _core
    from optfuse.torch import _binding

    advised = []
    real = _core.advise_huge_pages
    monkeypatch.setattr(_core, "advise_huge_pages", lambda p, n: advised.append(n) or real(p, n))
    for env, want in ((None, []), ("0", []), ("1", [8 << 20])):
        if env is None:
            monkeypatch.delenv("OPTFUSE_HUGE_PAGES", raising=False)
        else:
            monkeypatch.setenv("OPTFUSE_HUGE_PAGES", env)
        advised.clear()
        t = _binding._filled(torch.empty(8 << 20, dtype=torch.uint8), 3)
        assert advised == want, env
        assert bool((t == 3).all())
    advised.clear()
    _binding._filled(torch.empty(1024, dtype=torch.uint8), 0)  # too small to ask
    assert advised == []


def test_large_new_state_starts_at_its_own_page_offset(tmp_path):
    """New host state of 1 MiB or more starts 1, 2, 3 KiB past its param within a 4 KiB page
    (_binding._staggered), as views of slightly longer buffers that behave as plain tensors:
    torch's own values after steps, and a checkpoint loads into a fresh optimizer."""
    p0 = torch.randn(512, 1024).bfloat16()  # 1 MiB
    g = torch.randn_like(p0)
    got, want = torch.nn.Parameter(p0.clone()), torch.nn.Parameter(p0.clone())
    ours = oft.AdamW([got], lr=1e-2)  # master weights: three f32 buffers
    ref = torch.optim.AdamW([want], lr=1e-2)
    for _ in range(2):
        for p, opt in ((got, ours), (want, ref)):
            p.grad = g.clone()
            opt.step()
    state = ours.state[got]
    offsets = {k: (state[k].data_ptr() - got.data_ptr()) % 4096 for k in ("exp_avg", "exp_avg_sq")}
    offsets["master"] = (state["master"].data_ptr() - got.data_ptr()) % 4096
    assert sorted(offsets.values()) == [1024, 2048, 3072], offsets
    assert all(state[k].is_contiguous() and state[k].shape == got.shape for k in offsets)
    # torch's bf16 moments are rounded to bf16 once a step (2 steps: within 2 * 2^-8 relative).
    torch.testing.assert_close(
        state["exp_avg"], ref.state[want]["exp_avg"].float(), rtol=2**-7, atol=0.0
    )
    torch.save(ours.state_dict(), tmp_path / "sd.pt")
    again = torch.nn.Parameter(got.detach().clone())
    resumed = oft.AdamW([again], lr=1e-2)
    resumed.load_state_dict(torch.load(tmp_path / "sd.pt"))
    for p, opt in ((got, ours), (again, resumed)):
        p.grad = g.clone()
        opt.step()
    assert torch.equal(again, got)
    small = torch.nn.Parameter(torch.randn(1000))
    small.grad = torch.randn(1000)
    plain = oft.AdamW([small])
    plain.step()
    assert plain.state[small]["exp_avg"].storage_offset() == 0  # too small to move


def test_large_new_state_holds_torchs_initial_value():
    """A 12 MB param's state is made through the huge-page path (at least 4 MiB): its non-zero
    initial value must be torch's. One Adagrad step: sum = 0.25 + g * g, which torch and the
    fused kernel may round differently once (a multiply-add), so within 2 ulp of float32."""
    p0 = torch.randn(3, 1 << 20)
    g = torch.randn_like(p0)
    got, want = torch.nn.Parameter(p0.clone()), torch.nn.Parameter(p0.clone())
    ours = oft.Adagrad([got], lr=0.1, initial_accumulator_value=0.25)
    ref = torch.optim.Adagrad([want], lr=0.1, initial_accumulator_value=0.25)
    for p, opt in ((got, ours), (want, ref)):
        p.grad = g.clone()
        opt.step()
    torch.testing.assert_close(
        ours.state[got]["sum"], ref.state[want]["sum"], rtol=2.4e-7, atol=0.0
    )
