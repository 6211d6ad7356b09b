"""Bad input: torch's own validation messages, and clear errors naming the param at fault from a
step that then changes nothing."""

import pytest
import torch

import optfuse.torch as oft

BAD = {
    "SGD": [
        dict(lr=-1.0),
        dict(momentum=-0.1),
        dict(weight_decay=-1.0),
        dict(nesterov=True, momentum=0.0),
    ],
    "Adam": [
        dict(lr=-1.0),
        dict(eps=-1.0),
        dict(betas=(1.0, 0.9)),
        dict(betas=(0.9, -0.1)),
        dict(weight_decay=-1.0),
    ],
    "AdamW": [dict(lr=-1.0), dict(betas=(0.9, 1.5)), dict(eps=-1e-8)],
    "Adagrad": [
        dict(lr=-1.0),
        dict(lr_decay=-1.0),
        dict(initial_accumulator_value=-1.0),
        dict(eps=-1.0),
        dict(weight_decay=-1.0),
    ],
    "RMSprop": [dict(lr=-1.0), dict(alpha=-0.1), dict(eps=-1.0), dict(momentum=-1.0)],
    "Adamax": [dict(lr=-1.0), dict(betas=(1.0, 0.9)), dict(eps=-1.0)],
    "NAdam": [dict(lr=-1.0), dict(momentum_decay=-1.0), dict(betas=(0.9, 1.0))],
    "RAdam": [dict(lr=-1.0), dict(weight_decay=-1.0), dict(betas=(-0.1, 0.9))],
    "SparseAdam": [dict(lr=-1.0), dict(eps=-1.0), dict(betas=(1.0, 0.9))],
    "Adadelta": [
        dict(lr=-1.0),
        dict(rho=1.5),
        dict(rho=-0.1),
        dict(eps=-1.0),
        dict(weight_decay=-1.0),
    ],
    "ASGD": [dict(lr=-1.0), dict(lambd=-1.0), dict(alpha=-1.0), dict(weight_decay=-1.0)],
    "Rprop": [dict(lr=-1.0), dict(etas=(0.0, 1.2)), dict(etas=(0.5, 1.0)), dict(etas=(1.5, 2.0))],
    "Adafactor": [
        dict(lr=-1.0),
        dict(beta2_decay=0.1),
        dict(eps=(-1.0, 1e-3)),
        dict(eps=(None, -1.0)),
        dict(d=0.5),
        dict(weight_decay=-1.0),
    ],
}
CASES = [(name, kw) for name, kws in BAD.items() for kw in kws]


@pytest.mark.parametrize("name,kw", CASES, ids=[f"{n}-{kw}" for n, kw in CASES])
def test_validation_messages_are_torchs(name, kw):
    p = [torch.zeros(3, requires_grad=True)]
    with pytest.raises(ValueError) as theirs:
        getattr(torch.optim, name)(p, **kw)
    with pytest.raises(ValueError) as ours:
        getattr(oft, name)(p, **kw)
    assert str(ours.value) == str(theirs.value)


@pytest.mark.parametrize(
    "name,kw,message",
    [
        ("Lion", dict(lr=-1.0), "Invalid learning rate: -1.0"),
        ("Lion", dict(betas=(1.0, 0.9)), "Invalid beta parameter at index 0: 1.0"),
        ("LAMB", dict(eps=-1.0), "Invalid epsilon value: -1.0"),
        ("LAMB", dict(max_trust_ratio=-1.0), "Invalid max_trust_ratio value: -1.0"),
        ("LARS", dict(trust_coefficient=-1.0), "Invalid trust_coefficient value: -1.0"),
    ],
)
def test_validation_of_the_optimizers_torch_lacks(name, kw, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(".", r"\.")):
        getattr(oft, name)([torch.zeros(3, requires_grad=True)], **kw)


def test_torch_only_modes_are_refused():
    with pytest.raises(ValueError, match="capturable=True is not supported"):
        oft.Adam([torch.zeros(3, requires_grad=True)], capturable=True)
    with pytest.raises(ValueError, match="differentiable=True is not supported"):
        oft.SGD([torch.zeros(3, requires_grad=True)], differentiable=True)


def stepped():
    ps = [torch.randn(100, requires_grad=True), torch.randn(10, 10, requires_grad=True)]
    opt = oft.AdamW(ps, lr=1e-2)
    for p in ps:
        p.grad = torch.randn_like(p)
    opt.step()
    return ps, opt


def snapshot(ps, opt):
    return [p.detach().clone() for p in ps], {
        id(p): {k: v.clone() for k, v in opt.state[p].items()} for p in ps
    }


def unchanged(ps, opt, snap):
    params, state = snap
    return all(torch.equal(a, b) for a, b in zip(ps, params)) and all(
        torch.equal(v, opt.state[p][k]) for p in ps for k, v in state[id(p)].items()
    )


def test_a_param_whose_storage_moved_is_followed_as_torch_follows_it():
    ps, opt = stepped()
    with torch.no_grad():
        ps[1].data = ps[1].data.clone()  # a new storage under the same Parameter
    before = ps[1].detach().clone()
    opt.step()
    assert not torch.equal(ps[1], before)  # the new storage was updated
    assert opt.state[ps[1]]["step"].item() == 2


def test_a_resized_param_is_named_and_nothing_changes():
    ps, opt = stepped()
    with torch.no_grad():
        ps[0].data = torch.zeros(50)
    ps[0].grad = torch.ones(50)
    snap = snapshot(ps[1:], opt)
    with pytest.raises(ValueError, match=r"param group 0, param 0 .*was resized"):
        opt.step()
    assert unchanged(ps[1:], opt, snap) and torch.equal(ps[0], torch.zeros(50))


def test_bad_gradients_are_named_and_nothing_changes():
    ps, opt = stepped()
    snap = snapshot(ps, opt)
    ps[1].grad = torch.randn(10, 10)
    ps[1].grad.data = torch.randn(5, 10)  # (torch refuses such a grad when it is assigned)
    with pytest.raises(ValueError, match=r"param group 0, param 1 .*the gradient has shape"):
        opt.step()
    assert unchanged(ps, opt, snap)


def test_unsupported_params():
    p = torch.zeros(4, dtype=torch.complex64, requires_grad=True)
    opt = oft.SGD([p], lr=0.1)
    p.grad = torch.ones(4, dtype=torch.complex64)
    with pytest.raises(TypeError, match=r"param group 0, param 0 .*complex64 is not supported"):
        opt.step()


def test_mixed_devices_are_refused():
    a = torch.zeros(4, requires_grad=True)
    b = torch.zeros(4, device="meta", requires_grad=True)
    opt = oft.SGD([a, b], lr=0.1)
    a.grad = torch.ones(4)
    b.grad = torch.ones(4, device="meta")
    with pytest.raises(RuntimeError, match=r"param group 0, param 1 .*is on meta but .* on cpu"):
        opt.step()


def test_sparse_adam_rejects_dense_gradients_as_torch_does():
    p = torch.zeros(4, 3, requires_grad=True)
    opt = oft.SparseAdam([p])
    p.grad = torch.ones(4, 3)
    with pytest.raises(RuntimeError, match="does not support dense gradients"):
        opt.step()


def test_library_warnings_are_python_warnings(tmp_path):
    """A cache directory other users can write to is not used (cache/README.md, "Trust"); the
    warning saying so reaches Python's warnings machinery, not bare stderr."""
    from optfuse import _core

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.warns(RuntimeWarning, match="optfuse: kernel cache .* is not used"):
        _core.Engine(cache_dir=str(shared))


def test_shipped_schedules_are_found_next_to_the_extension():
    from optfuse import _core

    shipped = _core.shipped_schedule_dir()
    assert shipped.endswith("optfuse/share/optfuse/schedules"), shipped
