"""Drop-in replacements for torch.optim's optimizers, and Lion, LAMB, LARS and custom rules.

Each class below *is* its torch.optim class (a subclass), with torch's constructor, defaults,
validation messages, ``param_groups``, ``state`` and ``state_dict`` layout; only ``step()`` differs:
it runs optfuse's fused kernels. Every constructor also takes the keywords in
``optfuse.torch.STEP_OPTIONS`` (``max_grad_norm=``, ``loss_scale=``, ``accumulation_steps=``, ...),
and every param group the options in ``EXTRA_GROUP_OPTIONS`` (``state_dtype="bf16"``,
``grad_centralization=True``, ...).
"""

from __future__ import annotations

import inspect
import json
from typing import TYPE_CHECKING, Union

import torch
from torch.optim import Optimizer

from ._binding import Binding
from ._fused import EXTRA_GROUP_OPTIONS, STEP_OPTIONS, FusedOptimizer

if TYPE_CHECKING:
    import optfuse.rule

__all__ = [
    "SGD",
    "Adam",
    "AdamW",
    "Adagrad",
    "RMSprop",
    "Adamax",
    "NAdam",
    "RAdam",
    "Adadelta",
    "ASGD",
    "Rprop",
    "Adafactor",
    "SparseAdam",
    "Muon",
    "LBFGS",
    "Lion",
    "LAMB",
    "LARS",
    "Custom",
]


def _set_group_defaults(opt: Optimizer, options: dict) -> None:
    """Constructor keywords for every group (groups that set them keep theirs)."""
    for k, v in options.items():
        opt.defaults[k] = v
        for g in opt.param_groups:
            g.setdefault(k, v)


def _drop_in(cls):
    """Gives `cls` its torch base class's constructor plus the optfuse step keywords."""
    base = next(
        c for c in cls.__mro__[1:] if issubclass(c, Optimizer) and not issubclass(c, FusedOptimizer)
    )

    # The class's own group options: name -> a function giving the default (for None).
    own = getattr(cls, "_optfuse_own_options", {})

    def __init__(self, params, *args, **kwargs):
        step = {k: kwargs.pop(k) for k in STEP_OPTIONS if k in kwargs}
        group = {k: kwargs.pop(k) for k in EXTRA_GROUP_OPTIONS if k in kwargs}
        for k, default in own.items():
            v = kwargs.pop(k, None)
            group[k] = default() if v is None else v
        base.__init__(self, params, *args, **kwargs)
        _set_group_defaults(self, group)
        self._optfuse_setup(step)

    sig = inspect.signature(base.__init__)
    extra = [
        inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=None)
        for k in STEP_OPTIONS + EXTRA_GROUP_OPTIONS + tuple(own)
    ]
    __init__.__signature__ = sig.replace(parameters=list(sig.parameters.values()) + extra)
    __init__.__doc__ = base.__init__.__doc__
    cls.__init__ = __init__
    return cls


@_drop_in
class SGD(FusedOptimizer, torch.optim.SGD):
    """torch.optim.SGD (momentum, dampening, Nesterov, weight decay, maximize), fused."""

    _optfuse_type = "sgd"
    _optfuse_scalars = ()  # torch's SGD keeps no step count
    _optfuse_lazy_state = ("momentum_buffer",)  # torch makes it at a step where it is missing


@_drop_in
class Adam(FusedOptimizer, torch.optim.Adam):
    """torch.optim.Adam (AMSGrad, maximize, decoupled_weight_decay), fused."""

    _optfuse_type = "adam"

    def _optfuse_config(self) -> dict:
        decoupled = {bool(g.get("decoupled_weight_decay", False)) for g in self.param_groups}
        if len(decoupled) > 1:
            raise ValueError(
                "Adam: param groups differ in decoupled_weight_decay: optfuse needs "
                "one value per optimizer (use two optimizers)"
            )
        kind = "adamw" if decoupled == {True} else "adam"
        return {**super()._optfuse_config(), "type": kind}


@_drop_in
class AdamW(FusedOptimizer, torch.optim.AdamW):
    """torch.optim.AdamW (AMSGrad, maximize), fused: one pass over param, grad and state."""

    _optfuse_type = "adamw"


@_drop_in
class Adagrad(FusedOptimizer, torch.optim.Adagrad):
    """torch.optim.Adagrad (lr_decay, initial_accumulator_value), fused."""

    _optfuse_type = "adagrad"


@_drop_in
class RMSprop(FusedOptimizer, torch.optim.RMSprop):
    """torch.optim.RMSprop (centered, momentum), fused."""

    _optfuse_type = "rmsprop"


@_drop_in
class Adamax(FusedOptimizer, torch.optim.Adamax):
    """torch.optim.Adamax, fused."""

    _optfuse_type = "adamax"


@_drop_in
class NAdam(FusedOptimizer, torch.optim.NAdam):
    """torch.optim.NAdam (momentum_decay, decoupled_weight_decay), fused.

    ``state[p]["mu_product"]`` is torch's running product; optfuse advances it in double and
    stores it back in the tensor's dtype (float32) after every step.
    """

    _optfuse_type = "nadam"
    _optfuse_scalars = (("step", 0.0), ("mu_product", 1.0))


@_drop_in
class RAdam(FusedOptimizer, torch.optim.RAdam):
    """torch.optim.RAdam (decoupled_weight_decay), fused; rectification chosen per step."""

    _optfuse_type = "radam"


@_drop_in
class Adadelta(FusedOptimizer, torch.optim.Adadelta):
    """torch.optim.Adadelta, fused."""

    _optfuse_type = "adadelta"


@_drop_in
class ASGD(FusedOptimizer, torch.optim.ASGD):
    """torch.optim.ASGD (lambd, alpha, t0), fused: the param and its average ``ax`` in one pass.

    ``state[p]["eta"]`` and ``["mu"]`` are torch's 0-d tensors: the step reads them, and writes
    the next step's values back. A param's first step makes them as torch does (eta = the
    group's lr then, mu = 1).
    """

    _optfuse_type = "asgd"
    # torch's _init_group: eta starts at the group's lr when the param's state is made.
    _optfuse_scalars = (("step", 0.0), ("eta", lambda group: group["lr"]), ("mu", 1.0))


@_drop_in
class Rprop(FusedOptimizer, torch.optim.Rprop):
    """torch.optim.Rprop (etas, step_sizes), fused: per-element step sizes, ``prev`` and the
    param in one pass; ``step_size`` starts at the group's lr, as in torch."""

    _optfuse_type = "rprop"


@_drop_in
class Adafactor(FusedOptimizer, torch.optim.Adafactor):
    """torch.optim.Adafactor (relative step, update clipping, weight decay, maximize), fused.

    A param of two or more dims keeps torch's ``row_var`` ([..., R, 1]) and ``col_var``
    ([..., 1, C]): one kernel computes their new values, the update's RMS and the update, reading
    the gradient three times and the param twice. A vector keeps ``variance``: one kernel.
    ``foreach`` is accepted and changes nothing.
    """

    _optfuse_type = "adafactor"
    _optfuse_factored = True


@_drop_in
class SparseAdam(FusedOptimizer, torch.optim.SparseAdam):
    """torch.optim.SparseAdam: row-sparse gradients (``nn.Embedding(sparse=True)``), updating
    only the rows present, at a cost proportional to them."""

    _optfuse_type = "sparseadam"
    _optfuse_sparse = True

    def _optfuse_sparse_grads(self, b: Binding) -> None:
        for g in b.groups:
            # The C++ optimizer reads the values at the step: keep every tensor's alive till then.
            g.sparse_keep = []
            for k, p in enumerate(g.params):
                grad = p.grad
                if not grad.is_sparse:
                    raise RuntimeError(
                        "SparseAdam does not support dense gradients, please consider Adam instead"
                    )
                grad = grad.coalesce()
                if grad.sparse_dim() != 1 or grad.dtype != torch.float32:
                    raise RuntimeError(
                        f"param group {g.index}, param {g.active[k]}: optfuse's SparseAdam takes "
                        "float32 gradients sparse in the first dimension only (sparse_dim 1, "
                        f"as nn.Embedding gives); got sparse_dim {grad.sparse_dim()}, {grad.dtype}"
                    )
                rows = grad.indices()[0].contiguous()
                values = grad.values().contiguous()
                b.core.set_sparse_grad(
                    g.cpp, k, rows.data_ptr(), rows.numel(), values.data_ptr(), values.numel()
                )
                g.sparse_keep.append((rows, values))


def _fast_bf16_products() -> str:
    """Muon's ns_products default: "bf16" where torch multiplies bf16 matrices fast."""
    return "bf16" if torch.ops.mkldnn._is_mkldnn_bf16_supported() else "f32"


@_drop_in
class Muon(FusedOptimizer, torch.optim.Muon):
    """torch.optim.Muon (2-D params), fused: the momentum buffer and the Nesterov blend in one
    kernel, torch's Newton-Schulz orthogonalization of the update on torch's BLAS, then weight
    decay and the update in a second kernel.

    ``ns_products`` (a group option, optfuse's): ``"bf16"`` runs the orthogonalization as torch
    does, on bf16 matrices (torch's bits); ``"f32"`` multiplies the same bf16 values in f32 and
    rounds every product to bf16 once, as torch's bf16 results are rounded (the sums in another
    order: within bf16 rounding of torch's, 17x faster on an AVX2 EPYC, whose torch has no fast
    bf16 products). Default (``None``): ``"bf16"`` where it does (AVX512-BF16, AMX), else ``"f32"``.
    """

    _optfuse_type = "muon"
    _optfuse_scalars = ()  # torch's Muon keeps no step count
    _optfuse_lazy_state = ("momentum_buffer",)  # torch makes it at a step where it is missing
    _optfuse_own_options = {"ns_products": _fast_bf16_products}


class LBFGS(torch.optim.LBFGS):
    """torch.optim.LBFGS itself, unfused: so that swapping the import keeps working.

    L-BFGS is not an element-wise update. Each step is a closure-driven line search over all
    params viewed as ONE flat vector: dot products with a history of past directions and
    gradients, then one ``add_`` per tensor. torch already runs it on that flat vector, with no
    per-tensor pass that a fused kernel could merge, so optfuse offers torch's algorithm as it
    is (same results, state_dict and errors) and refuses its own step keywords here.
    """

    def __init__(self, params, *args, **kwargs):
        ours = sorted(k for k in kwargs if k in STEP_OPTIONS or k in EXTRA_GROUP_OPTIONS)
        if ours:
            raise ValueError(
                f"LBFGS: {ours} are optfuse step options, and LBFGS runs torch's own "
                "algorithm (its line search needs the closure's exact gradients): "
                "clip or scale them in the closure instead"
            )
        super().__init__(params, *args, **kwargs)


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise ValueError(message)


def _check_betas(betas) -> None:
    _check(0.0 <= betas[0] < 1.0, f"Invalid beta parameter at index 0: {betas[0]}")
    _check(0.0 <= betas[1] < 1.0, f"Invalid beta parameter at index 1: {betas[1]}")


class _Extra(FusedOptimizer, Optimizer):
    """An optimizer torch.optim lacks: torch's base class, validation in torch's wording."""

    def __init__(self, params, defaults: dict, step: dict):
        group = {k: step.pop(k) for k in EXTRA_GROUP_OPTIONS if k in step}
        unknown = sorted(set(step) - set(STEP_OPTIONS))
        if unknown:
            raise TypeError(f"{type(self).__name__}: unexpected keyword argument(s) {unknown}")
        Optimizer.__init__(self, params, defaults)
        _set_group_defaults(self, group)
        self._optfuse_setup(step)


class Lion(_Extra):
    """Lion (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms"), as lion-pytorch:
    ``update = sign(lerp(grad, exp_avg, beta1))``, decoupled weight decay, state ``exp_avg``."""

    _optfuse_type = "lion"
    _optfuse_scalars = ()

    def __init__(
        self, params, lr: float = 1e-4, betas=(0.9, 0.99), weight_decay: float = 0.0, **step
    ):
        _check(0.0 <= lr, f"Invalid learning rate: {lr}")
        _check_betas(betas)
        _check(0.0 <= weight_decay, f"Invalid weight_decay value: {weight_decay}")
        super().__init__(params, dict(lr=lr, betas=betas, weight_decay=weight_decay), step)


class LAMB(_Extra):
    """LAMB (You et al. 2020) as apex's FusedLAMB (adam_w_mode): per-tensor trust ratios from
    norms reduced inside the same kernel. Global gradient clipping is ``max_grad_norm=``."""

    _optfuse_type = "lamb"

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas=(0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.01,
        bias_correction: bool = True,
        max_trust_ratio: float = 0.0,
        **step,
    ):
        _check(0.0 <= lr, f"Invalid learning rate: {lr}")
        _check(0.0 <= eps, f"Invalid epsilon value: {eps}")
        _check_betas(betas)
        _check(0.0 <= weight_decay, f"Invalid weight_decay value: {weight_decay}")
        _check(0.0 <= max_trust_ratio, f"Invalid max_trust_ratio value: {max_trust_ratio}")
        super().__init__(
            params,
            dict(
                lr=lr,
                betas=betas,
                eps=eps,
                weight_decay=weight_decay,
                bias_correction=bias_correction,
                max_trust_ratio=max_trust_ratio,
            ),
            step,
        )


class LARS(_Extra):
    """LARS (You et al. 2017) as torchlars over SGD: the local lr is
    ``trust_coefficient * |p| / (|g| + weight_decay * |p| + eps)``, norms reduced in-kernel."""

    _optfuse_type = "lars"
    _optfuse_scalars = ()

    def __init__(
        self,
        params,
        lr: float = 0.1,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        trust_coefficient: float = 0.001,
        eps: float = 1e-8,
        **step,
    ):
        _check(0.0 <= lr, f"Invalid learning rate: {lr}")
        _check(0.0 <= momentum, f"Invalid momentum value: {momentum}")
        _check(0.0 <= weight_decay, f"Invalid weight_decay value: {weight_decay}")
        _check(0.0 <= trust_coefficient, f"Invalid trust_coefficient value: {trust_coefficient}")
        _check(0.0 <= eps, f"Invalid epsilon value: {eps}")
        super().__init__(
            params,
            dict(
                lr=lr,
                momentum=momentum,
                weight_decay=weight_decay,
                trust_coefficient=trust_coefficient,
                eps=eps,
            ),
            step,
        )


class Custom(_Extra):
    """An update rule of your own, fused and cached like the built-ins.

    ``rule`` is an ``optfuse.rule.Rule`` (Python expressions), or optfuse's JSON rule form (a dict,
    a JSON string, or a path to a ``.json`` file):
    ``{"name": ..., "defaults": {...}, "graph": <docs/graph-json.md>}``. Keywords override the
    rule's defaults, and every default is a param-group option (schedulers see them)::

        lion = {"name": "lion", "defaults": {"lr": 1e-4, "betas": [0.9, 0.99]}, "graph": {...}}
        opt = optfuse.torch.Custom(model.parameters(), lion, lr=3e-4)

    The state is ``state[p][name]`` for each state input of the graph, plus ``step``.
    """

    def __init__(self, params, rule: Union[dict, str, "optfuse.rule.Rule"], **kwargs):
        if hasattr(rule, "to_json"):  # an optfuse.rule.Rule
            rule = rule.to_json()
        if isinstance(rule, str):
            text = rule
            if not rule.lstrip().startswith("{"):
                with open(rule, encoding="utf-8") as f:
                    text = f.read()
            rule = json.loads(text)
        if not isinstance(rule, dict) or "defaults" not in rule or "graph" not in rule:
            raise ValueError(
                "Custom: rule must have 'name', 'defaults' and 'graph' (docs/graph-json.md)"
            )
        step = {k: kwargs.pop(k) for k in STEP_OPTIONS + EXTRA_GROUP_OPTIONS if k in kwargs}
        unknown = sorted(set(kwargs) - set(rule["defaults"]))
        if unknown:
            raise TypeError(
                f"Custom: unknown option(s) {unknown} for rule "
                f"'{rule.get('name', '?')}' (it has {sorted(rule['defaults'])})"
            )
        self._optfuse_rule = rule
        defaults = {
            k: (tuple(v) if isinstance(v, list) else v)
            for k, v in {**rule["defaults"], **kwargs}.items()
        }
        super().__init__(params, defaults, step)

    def __getstate__(self) -> dict:  # (copy.deepcopy, pickle): the rule too
        return {**super().__getstate__(), "_optfuse_rule": self._optfuse_rule}

    def __setstate__(self, state: dict) -> None:
        # (torch's load_state_dict calls this too, with only "state" and "param_groups".)
        rule = state.pop("_optfuse_rule", None)
        super().__setstate__(state)
        if rule is not None:
            self._optfuse_rule = rule

    def _optfuse_config(self) -> dict:
        return {"type": "custom", "rule": self._optfuse_rule, **self._optfuse_step_options}

    def _optfuse_group_keys(self) -> list:
        return list(self._optfuse_rule["defaults"]) + list(EXTRA_GROUP_OPTIONS)
