"""What every optfuse.torch optimizer shares: a ``torch.optim.Optimizer`` whose ``step()`` runs
optfuse's fused kernels.

``param_groups`` and ``state`` stay torch's own: the state tensors in ``optimizer.state[p]`` are
the buffers the kernels update in place (no second copy of the state), so torch's
``state_dict()`` / ``load_state_dict()`` and everything built on them work unchanged.

A step is one call into C++ (``_core.TorchStep``, python/src/torch_step.h): it checks every param
and gradient (dtype, device, shape, strides, storage) before any kernel runs, rebinds moved
gradients, passes changed hyperparameters (schedulers) on and runs the kernels with the GIL
released, so its Python work does not grow with the number of tensors. When the params with a
gradient, the groups or the state dicts change, it asks for a new binding (``_binding.py``).
"""

from __future__ import annotations

import inspect
from typing import Callable, Optional

import torch
from torch.optim.optimizer import _global_optimizer_post_hooks, _global_optimizer_pre_hooks

from .. import _core
from .._engine import engine
from . import _state8
from ._binding import TORCH_DTYPES, Binding, local, name_of, plain, scalar_dtype, scalar_initial

# Optimizer-wide step features (C++ StepOptions, include/optfuse/optim.h); constructor keywords.
STEP_OPTIONS = (
    "max_grad_norm",
    "norm_type",
    "error_if_nonfinite",
    "loss_scale",
    "init_scale",
    "growth_factor",
    "backoff_factor",
    "growth_interval",
    "accumulation_steps",
    "accumulation",
)
# Group options every optfuse optimizer takes besides torch's (mixed precision, GC).
EXTRA_GROUP_OPTIONS = (
    "state_dtype",
    "master_weights",
    "stochastic_rounding",
    "rounding_seed",
    "grad_centralization",
    "block_size",
    "min_8bit_size",
)
_REFUSED_FLAGS = ("capturable", "differentiable")
_NOT_RUN = object()  # (FusedOptimizer._optfuse_settle: no C++ step ran yet)
# Features that combine all params of the step: under FSDP2 each rank holds a shard of each.
_GLOBAL_STEP_OPTIONS = ("max_grad_norm", "loss_scale")


def _undecorated(name: str) -> Callable:
    """torch.optim.Optimizer's method `name` without its torch._disable_dynamo wrapper."""
    return inspect.unwrap(getattr(torch.optim.Optimizer, name))


class FusedOptimizer:
    """Mixin for torch.optim.Optimizer subclasses whose step() runs optfuse kernels.

    Subclasses set ``_optfuse_type`` (the C++ optimizer type) and call ``_optfuse_setup`` at the
    end of ``__init__``. Extra constructor keywords (``STEP_OPTIONS``) turn on optfuse's fused step
    features: ``max_grad_norm`` (clip_grad_norm_ over all params before the update; the norm is
    in ``last_step["total_norm"]``), ``loss_scale`` (a number, or ``"dynamic"`` with GradScaler's
    rule: multiply the loss by ``optimizer.loss_scale``), ``accumulation_steps``.
    """

    _optfuse_type: str = ""
    # torch's per-tensor scalar state: (name, initial value or a function of the param's group);
    # "step" where torch keeps one.
    _optfuse_scalars: tuple = (("step", 0.0),)
    # State torch makes at a step when it is missing (SGD's momentum_buffer): a checkpoint
    # without it is complete.
    _optfuse_lazy_state: tuple = ()
    _optfuse_sparse = False
    # The update of params of two or more dims factors over their last two dims (Adafactor):
    # their kernels read them in the contiguous order.
    _optfuse_factored = False

    def _optfuse_setup(self, step_options: dict) -> None:
        for flag in _REFUSED_FLAGS:
            if any(g.get(flag, False) for g in self.param_groups):
                raise ValueError(
                    f"{type(self).__name__}: {flag}=True is not supported by optfuse "
                    "(its kernels are already fused; use torch.optim for it)"
                )
        self._optfuse_step_options = {k: v for k, v in step_options.items() if v is not None}
        self._optfuse_binding: Optional[Binding] = None
        # torch's fused constructors set this, and GradScaler.step then leaves unscaling and the
        # inf check to the optimizer: optfuse's steps take GradScaler's usual path instead.
        self._step_supports_amp_scaling = False
        # ids of state tensors made for a step not yet applied (a refused, accumulated or
        # skipped step): they are still new state at the next binding (SGD's first step).
        self._optfuse_fresh: set = set()
        #: What the last step() did: ``outcome`` ("applied", "accumulated",
        #: "skipped_nonfinite"), ``total_norm`` (clip_grad_norm_'s value, or None),
        #: ``clip_coef``, ``loss_scale``, ``next_loss_scale``, ``micro_step``.
        self.last_step: Optional[dict] = None
        # torch validates in the constructor: so does optfuse, its own options too.
        self._optfuse_check_options(self.param_groups)

    # ---- what subclasses may refine -----------------------------------------------------------
    def _optfuse_config(self) -> dict:
        return {"type": self._optfuse_type, **self._optfuse_step_options}

    def _optfuse_group_keys(self) -> list:
        return list(_core.optimizer_defaults(self._optfuse_config()["type"])) + list(
            EXTRA_GROUP_OPTIONS
        )

    def _optfuse_scalar_state(self) -> tuple:
        return self._optfuse_scalars

    def _optfuse_initial_state(self, p, name: str, dtype) -> Optional[torch.Tensor]:
        """A new state tensor `name` of `p` made by the optimizer, or None for the rule's own
        initial value (a tensor full of it)."""
        return None

    def _optfuse_sparse_grads(self, b: Binding) -> None:
        pass

    def _optfuse_before_step(self) -> None:
        """Runs at the start of each step(), after the closure (rules with host scalars)."""

    # ---- validation ---------------------------------------------------------------------------
    def _optfuse_check_options(self, groups) -> None:
        """ValueError, as torch's constructor raises, for step options or group options the C++
        optimizer would refuse at the first step (max_grad_norm=-1, state_dtype="fp8")."""
        known = set(self._optfuse_group_keys())
        try:
            core = _core.Optimizer(engine(), self._optfuse_config())
            for g in groups:
                core.check_group({k: plain(v) for k, v in g.items() if k in known})
        except _core.Error as e:
            raise ValueError(f"{type(self).__name__}: {e}") from None

    # ---- torch.optim.Optimizer ----------------------------------------------------------------
    @property
    def loss_scale(self) -> float:
        """The factor to multiply the next loss by (1.0 without ``loss_scale``)."""
        b = self._optfuse_binding
        if b is None:
            s = self._optfuse_step_options.get("loss_scale")
            if s == "dynamic":
                return float(self._optfuse_step_options.get("init_scale", 65536.0))
            return float(s) if s is not None else 1.0
        return b.core.loss_scale()

    # torch.optim.Optimizer's add_param_group, zero_grad, state_dict and load_state_dict are
    # wrapped by torch._disable_dynamo, whose first call imports torch._dynamo: 1.5 s of start-up
    # for a torch.optim user, paid in the constructor. optfuse's step never runs under dynamo,
    # so it calls the functions underneath and starts in milliseconds.
    def add_param_group(self, param_group: dict) -> None:
        for flag in _REFUSED_FLAGS:
            if param_group.get(flag, False):
                raise ValueError(
                    f"{type(self).__name__}: {flag}=True is not supported by "
                    "optfuse (its kernels are already fused; use torch.optim for it)"
                )
        _undecorated("add_param_group")(self, param_group)
        if hasattr(self, "_optfuse_step_options"):  # (torch's __init__ adds the first groups)
            self._optfuse_check_options(self.param_groups[-1:])
        self._optfuse_binding = None

    def __getstate__(self) -> dict:  # (copy.deepcopy, pickle): torch's keeps only its own keys
        return {**super().__getstate__(), "_optfuse_step_options": self._optfuse_step_options}

    def __setstate__(self, state: dict) -> None:
        # (torch's load_state_dict calls this too, with only "state" and "param_groups": the step
        # options, which are the optimizer's configuration and not in a checkpoint, stay.)
        step = state.pop("_optfuse_step_options", None)
        if step is None:
            step = getattr(self, "_optfuse_step_options", {})
        super().__setstate__(state)
        self._optfuse_step_options = step
        self._optfuse_binding = None
        self._step_supports_amp_scaling = False
        self._optfuse_fresh = set()
        self.last_step = None

    def zero_grad(self, set_to_none: bool = True) -> None:
        _undecorated("zero_grad")(self, set_to_none)

    def state_dict(self) -> dict:
        return _undecorated("state_dict")(self)

    def load_state_dict(self, state_dict: dict) -> None:
        # torch casts state to the param's dtype; keep f32 state of 16-bit params f32.
        # (Saved ids map to params through the saved groups' "params" lists, as torch maps them.)
        raw = state_dict.get("state", {})
        saved_groups = state_dict.get("param_groups", [])
        _undecorated("load_state_dict")(self, state_dict)
        # torch's groups become the saved ones: a checkpoint without optfuse's own options (one
        # of torch.optim's) keeps the ones this optimizer was made with (master_weights=False).
        for sg, group in zip(saved_groups, self.param_groups):
            # 8-bit codes saved by a group without block_size were made at the default one.
            if "block_size" not in group and any(
                isinstance(v, torch.Tensor) and v.dtype == torch.uint8
                for i in sg.get("params", [])
                for v in raw.get(i, {}).values()
            ):
                group["block_size"] = _state8.DEFAULT_BLOCK
            for k in EXTRA_GROUP_OPTIONS + tuple(getattr(self, "_optfuse_own_options", ())):
                if k in self.defaults and k not in group:
                    group[k] = self.defaults[k]
        ids = {
            i: p
            for sg, g in zip(saved_groups, self.param_groups)
            for i, p in zip(sg["params"], g["params"])
        }
        # It casts 8-bit state's u8 codes too: they are restored as saved.
        for idx, saved in raw.items():
            p = ids.get(idx)
            if p is None:
                continue
            low = p.dtype in (torch.bfloat16, torch.float16)
            for k, v in saved.items():
                if (
                    isinstance(v, torch.Tensor)
                    and k != "step"
                    and (v.dtype == torch.uint8 or (low and v.dtype == torch.float32))
                ):
                    self.state[p][k] = v.to(device=p.device, copy=True)
        self._optfuse_binding = None

    def step(self, closure: Optional[Callable[[], float]] = None):
        """One fused update of every param that has a gradient; returns ``closure()``'s loss."""
        # torch.optim.Optimizer wraps every subclass's step() in a profiler range and its step
        # hooks: with no_grad's context, some 60 us a step, more than the whole C++ step of a
        # small model (bench/README.md, bench_overhead). optfuse's step() is marked as wrapped
        # already (below) and takes torch's wrapper only when a profiler runs or a hook is
        # registered.
        if (
            self._optimizer_step_pre_hooks
            or self._optimizer_step_post_hooks
            or _global_optimizer_pre_hooks
            or _global_optimizer_post_hooks
            or torch._C._autograd._profiler_enabled()
        ):
            return _hooked_step(self, closure)
        return self._optfuse_step(closure)

    step.hooked = True  # (torch's _patch_step_function then leaves it as it is)

    def _optfuse_step(self, closure: Optional[Callable[[], float]]):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self._optfuse_before_step()
        b = self._optfuse_binding
        # The usual step: the binding holds and C++ checks and runs it (in no_grad mode, its own).
        r = _NOT_RUN if b is None or self._optfuse_sparse else b.fast.step(*self._optfuse_args(b))
        if type(r) is not dict:
            with torch.no_grad():
                r = self._optfuse_settle(r)
            if r is None:
                return loss
        self.last_step = r
        if r["outcome"] == "applied":
            self._optfuse_fresh.clear()
        return loss

    def _optfuse_args(self, b: Binding) -> tuple:
        stream = torch.cuda.current_stream().cuda_stream if b.cuda else 0
        return self.param_groups, self.state, stream

    def _optfuse_settle(self, r) -> Optional[dict]:
        """The step, with the binding made or mended first as `r`, the C++ step's last answer,
        asks (_NOT_RUN: use the binding there is, if any). A new binding fits at once; a restate
        may follow it. The step's result, or None when no param has a gradient."""
        b = self._optfuse_binding
        for _ in range(4):
            if r is _NOT_RUN:
                b = b or self._optfuse_bind()
            elif r is None:  # the params with gradients, the groups or the state dicts changed
                b = self._optfuse_bind()
            else:  # (C++ group, old block_size): its state buffers changed (amsgrad, int8)
                try:
                    if not b.restate(self, *r):
                        b = self._optfuse_bind()
                except Exception:
                    self._optfuse_binding = None  # C++ took the new options: start over
                    raise
            if b is None:
                return None
            self._optfuse_sparse_grads(b)
            r = b.fast.step(*self._optfuse_args(b))
            if type(r) is dict:
                return r
        raise RuntimeError("optfuse: the binding does not settle (an internal error)")

    # ---- binding --------------------------------------------------------------------------------
    def _optfuse_bind(self) -> Optional[Binding]:
        """A new binding of the params that have gradients (None if none has)."""
        self._optfuse_binding = None
        with_grad = [
            (gi, pi, p)
            for gi, g in enumerate(self.param_groups)
            for pi, p in enumerate(g["params"])
            if p.grad is not None
        ]
        if not with_grad:
            return None
        cuda = self._optfuse_check_params(with_grad)
        self._optfuse_binding = b = Binding(self, cuda)
        return b

    def _optfuse_check_params(self, with_grad) -> bool:
        """Checks the params with a gradient before binding; whether they are CUDA tensors."""
        d = local(with_grad[0][2]).device
        for gi, pi, p in with_grad:
            lp = local(p)
            if lp.device != d:
                raise RuntimeError(
                    f"{name_of(gi, pi, p)}: is on {lp.device} but the first param "
                    f"with a gradient is on {d}: one optimizer per device"
                )
            if p.dtype not in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
                raise TypeError(
                    f"{name_of(gi, pi, p)}: dtype {p.dtype} is not supported "
                    "(float32, float64, bfloat16, float16)"
                )
            if lp is not p and any(k in self._optfuse_step_options for k in _GLOBAL_STEP_OPTIONS):
                raise ValueError(
                    f"{type(self).__name__}: max_grad_norm and loss_scale combine every param's "
                    "gradient, but under FSDP2 each rank holds a shard of each: use "
                    "torch.nn.utils.clip_grad_norm_ (it reduces over the ranks) and "
                    "torch.amp.GradScaler"
                )
        if d.type not in ("cpu", "cuda"):
            raise RuntimeError(
                f"{type(self).__name__}: params on {d}: optfuse runs on CPU and CUDA tensors"
            )
        return d.type == "cuda"

    def _optfuse_idle_state(self, p, b: Binding) -> None:
        """State for a param with a gradient but no elements on this rank (an FSDP2 shard that
        is empty here): made as for the others, so that every rank's state_dict() has the same
        entries, and its step advanced with theirs."""
        st = self.state[p]
        group = next(g for g in self.param_groups if any(q is p for q in g["params"]))
        for name, initial in self._optfuse_scalar_state():
            if name not in st:
                st[name] = torch.tensor(scalar_initial(initial, group), dtype=scalar_dtype())
            if name == "step":
                b.idle_steps.append(st[name])
        like = next((g for g in b.groups if g.params and g.params[0].dtype == p.dtype), None)
        if like is not None:
            for name, dtype, initial, from_param, _, _ in b.core.state_spec(like.cpp):
                want = TORCH_DTYPES[dtype]
                if name not in st:
                    st[name] = (
                        p.detach().to(dtype=want, copy=True)
                        if from_param
                        else torch.full_like(p, initial, dtype=want)
                    )


# FusedOptimizer's step as torch wraps it: in a profiler range, between the step hooks.
_hooked_step = torch.optim.Optimizer.profile_hook_step(FusedOptimizer._optfuse_step)
