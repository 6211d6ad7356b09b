"""optfuse.torch.LBFGS is torch's own L-BFGS (nothing to fuse: see its docstring), so that a
model whose import is swapped keeps working."""

import pytest
import torch

import optfuse.torch as oft


def rosenbrock_run(cls, steps=8, **kw):
    torch.manual_seed(0)
    x = torch.randn(2, 6, requires_grad=True)
    opt = cls([x], lr=0.5, history_size=5, line_search_fn="strong_wolfe", **kw)

    def closure():
        opt.zero_grad()
        a, b = x[0], x[1]
        loss = ((1 - a) ** 2 + 100 * (b - a * a) ** 2).sum()
        loss.backward()
        return loss

    losses = [opt.step(closure).item() for _ in range(steps)]
    return x.detach(), losses, opt.state_dict()


def test_lbfgs_is_torchs_algorithm_bit_for_bit():
    """The same code as torch.optim.LBFGS on the same inputs: the same bits, losses and state."""
    x_ref, loss_ref, sd_ref = rosenbrock_run(torch.optim.LBFGS)
    x, losses, sd = rosenbrock_run(oft.LBFGS)
    assert losses == loss_ref and losses[-1] < losses[0]
    assert torch.equal(x, x_ref)
    assert sd["state"][0]["n_iter"] == sd_ref["state"][0]["n_iter"]
    torch.optim.LBFGS([torch.zeros(2, 6, requires_grad=True)]).load_state_dict(sd)


def test_lbfgs_refuses_optfuse_step_options_naming_them():
    with pytest.raises(ValueError, match=r"LBFGS: \['max_grad_norm'\] are optfuse step options"):
        oft.LBFGS([torch.zeros(3, requires_grad=True)], max_grad_norm=1.0)
