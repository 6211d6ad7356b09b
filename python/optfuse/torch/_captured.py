"""``from_rule``: an optimizer from an update rule written as a PyTorch function (capture.py).

The optimizer is an ``optfuse.torch.Custom`` over the traced rule, so it behaves like the
built-ins: param groups, schedulers (every option is a group key), ``state_dict()`` in torch's
layout, the kernel cache.
"""

from __future__ import annotations

from typing import Callable, Optional, Union

import torch

from .capture import CaptureError, CapturedRule, rule
from .optimizers import Custom


class CapturedOptimizer(Custom):
    """A ``Custom`` optimizer whose rule is a captured PyTorch function; made by ``from_rule``.

    ``captured`` is the ``CapturedRule``; ``state_init`` and ``host_scalars`` are as given to
    ``from_rule``."""

    def __init__(
        self,
        params,
        fn: Union[Callable, CapturedRule],
        defaults: Optional[dict] = None,
        state_init: Optional[dict] = None,
        host_scalars: Optional[Callable[[dict, int], dict]] = None,
        **kwargs,
    ):
        captured = rule(fn)
        defaults = {**captured.defaults, **(defaults or {})}
        self.captured = captured
        self.host_scalars = host_scalars
        self._host_names: list = []
        if host_scalars is not None:
            # Their names become group options (so C++ takes them as hyperparameters), set
            # before every step from host_scalars(group, step).
            first = dict(host_scalars(dict(defaults), 1))
            clash = sorted(set(first) & set(defaults))
            if clash:
                raise CaptureError(
                    f"from_rule: host_scalars gives {clash}, which are options "
                    "in the defaults too: give each scalar one source"
                )
            self._host_names = sorted(first)
            defaults.update({k: float(v) for k, v in first.items()})
        self.state_init = dict(state_init or {})
        unknown = sorted(set(self.state_init) - set(captured.state_names))
        if unknown:
            raise CaptureError(
                f"from_rule: state_init names {unknown}, which rule "
                f"{captured.name!r} does not take (its state: "
                f"{captured.state_names})"
            )
        json_rule = captured.to_json(defaults)
        self._rows = captured.row_reductions(defaults)
        super().__init__(params, json_rule, **kwargs)

    _OWN = ("captured", "host_scalars", "_host_names", "state_init", "_rows")

    def __getstate__(self) -> dict:  # (copy.deepcopy, pickle): the rule and its options too
        return {**super().__getstate__(), **{k: getattr(self, k) for k in self._OWN}}

    def __setstate__(self, state: dict) -> None:
        # (torch's load_state_dict calls this too, with only "state" and "param_groups".)
        own = {k: state.pop(k) for k in self._OWN if k in state}
        super().__setstate__(state)
        self.__dict__.update(own)

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)
        self._check_row_shapes(len(self.param_groups) - 1, self.param_groups[-1])

    def _check_row_shapes(self, gi: int, group: dict) -> None:
        """A row reduction was traced on 2-D tensors as a reduction over the last dim; on more
        dims optfuse's rows (all dims but the first) would not be what eager torch computes."""
        if not self._rows:
            return
        for pi, p in enumerate(group["params"]):
            if p.dim() > 2:
                raise CaptureError(
                    f"from_rule: param group {gi}, param {pi} has shape {tuple(p.shape)}, but "
                    f"rule {self.captured.name!r} reduces per row ({self._rows[0]}), which "
                    "optfuse takes over every dim but the first: for tensors of more than 2 "
                    "dims that is not what the function computes eagerly. Flatten such params "
                    "or keep them in another optimizer."
                )

    def _optfuse_initial_state(self, p, name: str, dtype) -> Optional[torch.Tensor]:
        init = self.state_init.get(name)
        if init is None:
            return None
        if callable(init):
            t = init(p)
            if not isinstance(t, torch.Tensor):
                raise TypeError(
                    f"from_rule: state_init[{name!r}] returned a {type(t).__name__}, not a tensor"
                )
            return t
        return torch.full_like(p, float(init), dtype=dtype, memory_format=torch.contiguous_format)

    def _optfuse_before_step(self) -> None:
        if self.host_scalars is not None:
            for group in self.param_groups:
                step = self._next_step(group)
                if step is None:
                    continue
                values = dict(self.host_scalars(group, step))
                if sorted(values) != self._host_names:
                    raise CaptureError(
                        f"from_rule: host_scalars gave {sorted(values)} at step "
                        f"{step}, {self._host_names} at the start"
                    )
                group.update({k: float(v) for k, v in values.items()})

    def _next_step(self, group: dict) -> Optional[int]:
        """The step count the group's next update uses (its first param with a gradient)."""
        for p in group["params"]:
            if p.grad is not None:
                s = self.state.get(p, {}).get("step")
                return int(s.item() if isinstance(s, torch.Tensor) else (s or 0)) + 1
        return None


def from_rule(
    fn: Union[Callable, CapturedRule],
    params,
    defaults: Optional[dict] = None,
    state_init: Optional[dict] = None,
    host_scalars: Optional[Callable[[dict, int], dict]] = None,
    **kwargs,
) -> CapturedOptimizer:
    """An optimizer that runs `fn` (a PyTorch update rule, see ``optfuse.torch.capture``) as
    one fused kernel per tensor.

    ``defaults``: the group options (``lr``, ``betas``, ...) the function's keyword arguments
    name; each is a param-group key, so schedulers and ``group["lr"] = x`` work and never
    recompile. ``state_init``: state name -> initial value (a number, or a function of the param
    returning a tensor); state starts at zero otherwise. ``host_scalars(group, step) -> dict``:
    per-step values computed in Python once per group before each step (a schedule weight, a
    first-step coefficient), passed to the kernel as scalars named by the dict's keys (keyword
    arguments of `fn`). Other keywords are those of ``optfuse.torch.Custom`` (``max_grad_norm``,
    ``state_dtype``, ...)."""
    return CapturedOptimizer(
        params, fn, defaults, state_init=state_init, host_scalars=host_scalars, **kwargs
    )
