"""What torch.optim users and wrappers do to an optimizer between steps, each against torch:
state replaced or deleted, params swapped, copies, autograd's version checks, GradScaler with
fused=True, several sparse embeddings in one group."""

import copy

import pytest
import torch

import optfuse.torch as oft
from conftest import grad_for, lockstep, make_params, max_abs


def pair(p0):
    return ([p.clone().requires_grad_() for p in p0], [p.clone().requires_grad_() for p in p0])


def test_deleted_and_assigned_state_is_used_as_torch_uses_it():
    """del state[p] starts fresh state; assigning a state dict (as ZeroRedundancyOptimizer's
    load_state_dict does to its local optimizer) is what the next step reads."""
    p0 = make_params()
    ref, ours = pair(p0)
    a, b = torch.optim.AdamW(ref, lr=1e-2), oft.AdamW(ours, lr=1e-2)
    lockstep([(a, ref), (b, ours)], 3)
    del a.state[ref[0]], b.state[ours[0]]
    saved_a = copy.deepcopy(a.state[ref[1]])
    saved_b = copy.deepcopy(b.state[ours[1]])
    lockstep([(a, ref), (b, ours)], 2)
    a.state[ref[1]], b.state[ours[1]] = saved_a, saved_b
    lockstep([(a, ref), (b, ours)], 2)
    assert max_abs(ours, ref) < 2e-5
    assert b.state[ours[0]]["step"].item() == 4 and b.state[ours[1]]["step"].item() == 5


def test_a_param_swapped_into_a_group_is_the_one_updated():
    p0 = make_params()
    ref, ours = pair(p0)
    a, b = torch.optim.SGD(ref, lr=1e-2, momentum=0.9), oft.SGD(ours, lr=1e-2, momentum=0.9)
    lockstep([(a, ref), (b, ours)], 2)
    new_ref, new_ours = (
        ref[0].detach().clone().requires_grad_(),
        ours[0].detach().clone().requires_grad_(),
    )
    a.param_groups[0]["params"][0] = new_ref
    b.param_groups[0]["params"][0] = new_ours
    ref[0], ours[0] = new_ref, new_ours
    lockstep([(a, ref), (b, ours)], 2)
    assert max_abs(ours, ref) < 2e-5


def test_new_data_under_a_state_tensor_is_never_written_through_freed_memory():
    p = torch.randn(4096, requires_grad=True)
    opt = oft.Adam([p], lr=1e-2)
    p.grad = torch.ones(4096)
    opt.step()
    old = opt.state[p]["exp_avg"]
    old.data = torch.zeros(4096)  # the bound storage's last reference goes
    bystander = torch.zeros(4096)  # would often get the freed block
    opt.step()
    assert torch.equal(bystander, torch.zeros(4096))


def test_deepcopy_and_pickle_keep_a_working_optimizer():
    p = torch.randn(100, requires_grad=True)
    opt = oft.AdamW([p], lr=1e-2, max_grad_norm=1.0)
    p.grad = torch.ones(100)
    opt.step()
    twin = copy.deepcopy(opt)
    twin.param_groups[0]["params"][0].grad = torch.ones(100)
    twin.step()
    assert twin.last_step["total_norm"] == pytest.approx(10.0)


def test_autograd_sees_the_params_changed_in_place():
    """As after torch's in-place update: backward through a graph that saved the param before
    the step is refused (it would use the updated values)."""
    for cls in (torch.optim.SGD, oft.SGD):
        w = torch.randn(8, requires_grad=True)
        opt = cls([w], lr=0.1)
        loss = (w * w).sum()  # saves w
        w.grad = torch.ones(8)
        opt.step()
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            loss.backward()


def test_fused_true_with_grad_scaler_unscales_as_torch_does():
    """torch's fused=True optimizers take GradScaler's scale themselves; optfuse's take
    GradScaler's usual unscale path."""
    out = []
    for cls, kw in ((torch.optim.SGD, {}), (oft.SGD, {"fused": True})):
        w = torch.ones(4, requires_grad=True)
        opt = cls([w], lr=0.1, **kw)
        scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
        for _ in range(3):
            opt.zero_grad()
            scaler.scale(w.sum()).backward()
            scaler.step(opt)
            scaler.update()
        out.append(w.detach().clone())
    assert torch.allclose(out[0], out[1]) and torch.allclose(out[0], torch.full((4,), 0.7))


def test_state_made_for_a_refused_step_is_still_new_state_later():
    """SGD's first momentum step copies the gradient: a step refused before it (here by
    error_if_nonfinite) must not turn the new buffer into an old one."""
    ref, ours = pair(make_params())
    a = torch.optim.SGD(ref, lr=1e-2, momentum=0.9, dampening=0.5)
    b = oft.SGD(
        ours, lr=1e-2, momentum=0.9, dampening=0.5, max_grad_norm=1.0, error_if_nonfinite=True
    )
    for p in ours:
        p.grad = torch.full_like(p, float("inf"))
    with pytest.raises(RuntimeError):
        b.step()
    ours[0].grad = None  # another binding at the next step
    ref[0].grad = None
    for k in range(1, len(ours)):
        ref[k].grad = grad_for(ref[k], 0, k)
        ours[k].grad = grad_for(ours[k], 0, k)
    total = torch.nn.utils.clip_grad_norm_(ref[1:], 1.0)
    a.step()
    b.step()
    assert b.last_step["total_norm"] == pytest.approx(total.item(), rel=1e-5)
    assert max_abs(ours, ref) < 2e-5


def test_sparse_adam_with_several_embeddings_in_one_group():
    torch.manual_seed(0)
    ea = [torch.nn.Embedding(30, 4, sparse=True) for _ in range(3)]
    eb = [torch.nn.Embedding(30, 4, sparse=True) for _ in range(3)]
    for x, y in zip(ea, eb):
        y.load_state_dict(x.state_dict())
    pa = [e.weight for e in ea]
    pb = [e.weight for e in eb]
    a, b = torch.optim.SparseAdam(pa, lr=1e-2), oft.SparseAdam(pb, lr=1e-2)
    for step in range(20):
        idx = torch.randint(0, 30, (8,), generator=torch.Generator().manual_seed(step))
        for embs, opt in ((ea, a), (eb, b)):
            opt.zero_grad()
            sum(e(idx).pow(2).sum() * (k + 1) for k, e in enumerate(embs)).backward()
            opt.step()
    assert max_abs(pb, pa) < 2e-5
