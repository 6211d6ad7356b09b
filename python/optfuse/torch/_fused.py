"""The machinery every optfuse.torch optimizer shares: binding torch tensors to the C++ optimizer.

A ``FusedOptimizer`` is a ``torch.optim.Optimizer`` whose ``step()`` runs optfuse's fused kernels.
``param_groups`` and ``state`` stay torch's own: the state tensors in ``optimizer.state[p]`` are
the buffers the kernels update in place (no copy, no second copy of the state), so torch's
``state_dict()`` / ``load_state_dict()`` and everything built on them work unchanged.

Each step:
1. finds the params that have a gradient (torch skips the others) and, when that set, the groups
   or the state dict object changed, builds a new C++ optimizer over them (``_Binding``);
2. checks every param and gradient (device, dtype, layout, size, storage) and rebinds the
   gradients whose storage moved (``zero_grad(set_to_none=True)`` gives new ones every step);
3. passes every hyperparameter that changed in ``param_groups`` (schedulers) to C++;
4. runs the step: one fused kernel call per tensor, with the GIL released.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Optional

import torch

from .. import _core
from .._engine import engine
from . import _state8

_DTYPE_NAMES = {torch.float32: "f32", torch.bfloat16: "bf16", torch.float16: "f16"}
_TORCH_DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16,
                 "u8": torch.uint8,
                 "f64": torch.float64}

# Optimizer-wide step features (C++ StepOptions, include/optfuse/optim.h); constructor keywords.
STEP_OPTIONS = ("max_grad_norm", "norm_type", "error_if_nonfinite", "loss_scale", "init_scale",
                "growth_factor", "backoff_factor", "growth_interval", "accumulation_steps",
                "accumulation")
# Group options every optfuse optimizer takes besides torch's (mixed precision, GC).
EXTRA_GROUP_OPTIONS = ("state_dtype", "master_weights", "stochastic_rounding", "rounding_seed",
                       "grad_centralization", "block_size", "min_8bit_size")
# torch flags that choose torch's implementation: accepted (optfuse is always fused), or refused.
_IMPLEMENTATION_FLAGS = ("foreach", "fused")
_REFUSED_FLAGS = ("capturable", "differentiable")


def _undecorated(name: str) -> Callable:
    """torch.optim.Optimizer's method `name` without its torch._disable_dynamo wrapper."""
    return inspect.unwrap(getattr(torch.optim.Optimizer, name))


def _plain(value: Any) -> Any:
    """A hyperparameter as the C++ side takes it: tensors (and numpy scalars) as numbers, tuples
    as lists."""
    if isinstance(value, torch.Tensor) or hasattr(value, "item"):
        return value.item()
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    return value


def _name(gi: int, pi: int, p: torch.Tensor) -> str:
    return f"param group {gi}, param {pi} (shape {tuple(p.shape)}, {p.dtype})"


class _Group:
    """One torch param group as bound to one C++ group."""

    __slots__ = ("index", "cpp", "params", "active", "ptrs", "numels", "grad_dtype", "keys",
                 "synced", "spec", "sparse_keep", "states")

    def __init__(self, index, cpp, params, active, keys):
        self.index = index    # position in optimizer.param_groups
        self.cpp = cpp        # position among the C++ groups (only groups with gradients)
        self.params = params  # the active params, in group order
        self.active = active  # their positions in the group's "params"
        self.ptrs = [p.data_ptr() for p in params]
        self.numels = [p.numel() for p in params]
        self.grad_dtype = params[0].grad.dtype
        self.keys = keys      # the group's keys the C++ rule takes
        self.synced: dict = {}
        self.spec: list = []
        self.sparse_keep: list = []  # this step's coalesced sparse gradients (SparseAdam)
        self.states: list = []  # the optimizer.state dict of each param, as bound


class _Binding:
    """A C++ optimizer over the params that have gradients, with the state tensors bound."""

    def __init__(self, opt: "FusedOptimizer", cuda: bool):
        self.cuda = cuda
        self.state_obj = opt.state
        self.core = _core.Optimizer(engine(cuda), opt._optfuse_config())
        self.groups: list[_Group] = []
        # The storage of every tensor the C++ optimizer reads or writes, kept alive while it may
        # (a state tensor replaced in optimizer.state, or given new .data, is not freed under it).
        self.keep: list = []
        known = set(opt._optfuse_group_keys())
        for gi, group in enumerate(opt.param_groups):
            active = [i for i, p in enumerate(group["params"]) if p.grad is not None]
            if not active:
                continue
            params = [group["params"][i] for i in active]
            # (8-bit state's options also when a group gains them later: they change buffers.)
            keys = [k for k in group if k in known] + [
                k for k in _state8.BLOCKING_KEYS if k in known and k not in group]
            g = _Group(gi, len(self.groups), params, active, keys)
            g.synced = {k: _plain(group[k]) for k in keys if k in group}
            entries = []
            for i, p in zip(active, params):
                grad = opt._optfuse_dense_grad(p, gi, i)
                entries.append((p.data_ptr(), grad.data_ptr() if grad is not None else 0,
                                p.numel(), list(p.shape), _DTYPE_NAMES[p.dtype],
                                _DTYPE_NAMES[grad.dtype] if grad is not None else "f32",
                                _name(gi, i, p)))
            self.core.add_param_group(entries, g.synced, cuda)
            self.keep.extend(p.untyped_storage() for p in params)
            self.groups.append(g)
        for g in self.groups:
            self.bind_state(opt, g)

    def bind_state(self, opt: "FusedOptimizer", g: _Group, old_block: Optional[int] = None) -> None:
        """Binds every state buffer of `g`'s params to its tensor in ``opt.state`` (made now,
        with torch's initial values, where missing). 8-bit state held at block size
        `old_block` (default: the group's) is converted to what the step needs, for every param
        before any is changed (_state8.conversions)."""
        g.spec = self.core.state_spec(g.cpp)
        g.states = []
        fresh = opt._optfuse_fresh
        block = int(g.synced.get("block_size", _state8.DEFAULT_BLOCK))
        old_block = block if old_block is None else int(old_block)
        specs = [self.core.state_spec(g.cpp, k) for k in range(len(g.params))]  # per tensor
        changes = []
        for k, p in enumerate(g.params):
            def initial(name, p=p):  # a rule's own initial values (state_init), encoded
                return opt._optfuse_initial_state(p, name, torch.float32)
            changes.append(_state8.conversions(opt.state[p], specs[k], old_block, block,
                                               _name(g.index, g.active[k], p), initial))
        for k, p in enumerate(g.params):
            spec = specs[k]
            names = {s[0] for s in spec}
            st = opt.state[p]
            g.states.append(st)
            if "master" not in names:
                # master_weights=False: the param is the value (a kept copy would be stale if
                # master weights came back), and state_dict() is then torch's own layout.
                st.pop("master", None)
            converted, new = changes[k]
            for name, t in converted.items():
                if t is None:
                    st.pop(name, None)
                else:
                    st[name] = t
                    if name in new:
                        fresh.add(id(t))
            for name, dtype, initial, from_param, numel in spec:
                want = _TORCH_DTYPES[dtype]
                t = st.get(name)
                made = t is None
                if made:
                    t = opt._optfuse_initial_state(p, name, want)
                if made and t is not None:  # the optimizer's own initial value (from_rule)
                    t = self._checked_state(t, p, name, want, g.index, g.active[k])
                    fresh.add(id(t))
                elif made:
                    if from_param:  # the f32 master copy of a 16-bit param
                        t = p.detach().to(dtype=want, memory_format=torch.contiguous_format,
                                          copy=True)
                    elif numel != p.numel():  # 8-bit state's scales: one per block
                        t = torch.full((numel,), initial, dtype=want)
                        fresh.add(id(t))
                    else:
                        t = torch.full_like(p, initial, dtype=want,
                                            memory_format=torch.contiguous_format)
                        fresh.add(id(t))  # new state until a step is applied with it
                else:
                    t = self._checked_state(t, p, name, want, g.index, g.active[k], numel)
                st[name] = t
                self.keep.append(t.untyped_storage())
                self.core.bind_state(g.cpp, k, name, t.data_ptr(), t.numel(), dtype,
                                     id(t) in fresh)
            for name, initial in opt._optfuse_scalar_state():
                s = st.get(name)
                if not (isinstance(s, torch.Tensor) and s.device.type == "cpu" and s.dim() == 0
                        and s.dtype in (torch.float32, torch.float64)):
                    s = torch.tensor(float(initial if s is None else _plain(s)),
                                     dtype=torch.float32)
                    st[name] = s
                self.keep.append(s.untyped_storage())
                self.core.bind_scalar(g.cpp, k, name, s.data_ptr(),
                                      "f64" if s.dtype == torch.float64 else "f32")

    @staticmethod
    def _checked_state(t, p, name, want, gi, pi, numel=None) -> torch.Tensor:
        """A state tensor from the user or a checkpoint, as the kernel needs it."""
        where = f"{_name(gi, pi, p)}: state '{name}'"
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{where} is a {type(t).__name__}, not a tensor")
        if numel is not None and numel != p.numel():  # 8-bit state's scales
            if t.shape != (numel,):
                raise ValueError(f"{where} has shape {tuple(t.shape)}, the state needs "
                                 f"({numel},): one scale per block (was it made with another "
                                 "block_size?)")
        elif t.shape != p.shape:
            raise ValueError(f"{where} has shape {tuple(t.shape)}, the param {tuple(p.shape)}")
        if t.dtype != want or t.device != p.device or not t.is_contiguous():
            t = t.to(dtype=want, device=p.device, memory_format=torch.contiguous_format,
                     copy=True)
        return t


class FusedOptimizer:
    """Mixin for torch.optim.Optimizer subclasses whose step() runs optfuse kernels.

    Subclasses set ``_optfuse_type`` (the C++ optimizer type) and call ``_optfuse_setup`` at the
    end of ``__init__``. Extra constructor keywords (``STEP_OPTIONS``) turn on optfuse's fused step
    features: ``max_grad_norm`` (clip_grad_norm_ over all params before the update; the norm is
    in ``last_step["total_norm"]``), ``loss_scale`` (a number, or ``"dynamic"`` with GradScaler's
    rule: multiply the loss by ``optimizer.loss_scale``), ``accumulation_steps``.
    """

    _optfuse_type: str = ""
    # torch's per-tensor scalar state: (name, initial value); "step" where torch keeps one.
    _optfuse_scalars: tuple = (("step", 0.0),)

    def _optfuse_setup(self, step_options: dict) -> None:
        for flag in _REFUSED_FLAGS:
            if any(g.get(flag, False) for g in self.param_groups):
                raise ValueError(f"{type(self).__name__}: {flag}=True is not supported by optfuse "
                                 "(its kernels are already fused; use torch.optim for it)")
        self._optfuse_step_options = {k: v for k, v in step_options.items() if v is not None}
        self._optfuse_binding: Optional[_Binding] = None
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

    # ---- what subclasses may refine -----------------------------------------------------------
    def _optfuse_config(self) -> dict:
        return {"type": self._optfuse_type, **self._optfuse_step_options}

    def _optfuse_group_keys(self) -> list:
        return list(_core.optimizer_defaults(self._optfuse_config()["type"])) + list(
            EXTRA_GROUP_OPTIONS)

    def _optfuse_scalar_state(self) -> tuple:
        return self._optfuse_scalars

    def _optfuse_initial_state(self, p, name: str, dtype) -> Optional[torch.Tensor]:
        """A new state tensor `name` of `p` made by the optimizer, or None for the rule's own
        initial value (a tensor full of it)."""
        return None

    def _optfuse_dense_grad(self, p, gi, pi):
        return p.grad

    def _optfuse_sparse_grads(self, b: _Binding) -> None:
        pass

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
                raise ValueError(f"{type(self).__name__}: {flag}=True is not supported by "
                                 "optfuse (its kernels are already fused; use torch.optim for it)")
        _undecorated("add_param_group")(self, param_group)
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
                    for i in sg.get("params", []) for v in raw.get(i, {}).values()):
                group["block_size"] = _state8.DEFAULT_BLOCK
            for k in EXTRA_GROUP_OPTIONS:
                if k in self.defaults and k not in group:
                    group[k] = self.defaults[k]
        ids = {i: p for sg, g in zip(saved_groups, self.param_groups)
               for i, p in zip(sg["params"], g["params"])}
        # It casts 8-bit state's u8 codes too: they are restored as saved.
        for idx, saved in raw.items():
            p = ids.get(idx)
            if p is None:
                continue
            low = p.dtype in (torch.bfloat16, torch.float16)
            for k, v in saved.items():
                if isinstance(v, torch.Tensor) and k != "step" and (
                        v.dtype == torch.uint8 or (low and v.dtype == torch.float32)):
                    self.state[p][k] = v.to(device=p.device, copy=True)
        self._optfuse_binding = None

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], float]] = None):
        """One fused update of every param that has a gradient; returns ``closure()``'s loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        b = self._optfuse_current_binding()
        if b is None:
            return loss
        if any([self._optfuse_params_moved(g) for g in b.groups]):
            self._optfuse_binding = None
            b = self._optfuse_current_binding()
        self._optfuse_sparse_grads(b)
        for g in b.groups:
            self._optfuse_sync_group(b, g)
        stream = 0
        if b.cuda:
            stream = torch.cuda.current_stream().cuda_stream
        self.last_step = r = b.core.step(stream)
        if r["outcome"] == "applied":
            self._optfuse_fresh.clear()
            # The kernels wrote the params in place: autograd must see them as changed, as after
            # torch's own in-place updates (a graph saved before the step then refuses backward).
            torch.autograd.graph.increment_version([p for g in b.groups for p in g.params])
        return loss

    # ---- the per-step checks ------------------------------------------------------------------
    def _optfuse_current_binding(self) -> Optional[_Binding]:
        b = self._optfuse_binding
        if b is not None and b.state_obj is self.state and self._optfuse_same_active(b):
            return b
        devices = {p.device for g in self.param_groups for p in g["params"] if p.grad is not None}
        if not devices:
            return None
        cuda = self._optfuse_check_devices(devices)
        self._optfuse_binding = None
        self._optfuse_binding = b = _Binding(self, cuda)
        return b

    def _optfuse_same_active(self, b: _Binding) -> bool:
        """Whether exactly the bound params have gradients, in the bound groups."""
        k = 0
        for gi, group in enumerate(self.param_groups):
            params = group["params"]
            bg = b.groups[k] if k < len(b.groups) else None
            if bg is not None and bg.index == gi:
                k += 1
                if len(bg.active) == len(params) and all(p.grad is not None for p in params):
                    active = params
                elif [i for i, p in enumerate(params) if p.grad is not None] != bg.active:
                    return False
                else:
                    active = [params[i] for i in bg.active]
                # The same tensors (one may have been swapped into the group), with the same
                # state dicts (del / assignment of optimizer.state[p], as ZeRO's load does).
                state = self.state
                if any(p is not q or state.get(p) is not d
                       for p, q, d in zip(active, bg.params, bg.states)):
                    return False
            elif any(p.grad is not None for p in params):
                return False
        return k == len(b.groups)

    def _optfuse_check_devices(self, devices) -> bool:
        """Checks every param with a gradient; whether they are CUDA tensors."""
        first = next(p for g in self.param_groups for p in g["params"] if p.grad is not None)
        d = first.device
        if len(devices) > 1:
            gi, pi, p = next((gi, pi, p) for gi, g in enumerate(self.param_groups)
                             for pi, p in enumerate(g["params"])
                             if p.grad is not None and p.device != d)
            raise RuntimeError(f"{_name(gi, pi, p)}: is on {p.device} but the first param with a "
                               f"gradient is on {d}: one optimizer per device")
        if d.type not in ("cpu", "cuda"):
            raise RuntimeError(f"{type(self).__name__}: params on {d}: optfuse runs on CPU and "
                               "CUDA tensors")
        for gi, group in enumerate(self.param_groups):
            for pi, p in enumerate(group["params"]):
                if p.grad is None:
                    continue
                if p.dtype not in _DTYPE_NAMES:
                    raise TypeError(f"{_name(gi, pi, p)}: dtype {p.dtype} is not supported "
                                    "(float32, bfloat16, float16)")
                if not p.is_contiguous():
                    raise ValueError(f"{_name(gi, pi, p)}: is not contiguous (strides "
                                     f"{p.stride()}); optfuse updates params in place")
        return d.type == "cuda"

    @staticmethod
    def _optfuse_params_moved(g: _Group) -> bool:
        """Whether a param's storage moved since it was bound (``p.data = ...``: torch follows
        the Parameter, and so does the next binding); a resized param is an error, before any
        kernel runs (its state no longer fits)."""
        params = g.params
        if [p.data_ptr() for p in params] == g.ptrs:
            if [p.numel() for p in params] == g.numels:
                return False
        for k, p in enumerate(params):
            if p.numel() != g.numels[k]:
                raise RuntimeError(
                    f"{_name(g.index, g.active[k], p)}: was resized since its state was made "
                    f"({g.numels[k]} elements then); nothing was updated")
        return True

    def _optfuse_sync_group(self, b: _Binding, g: _Group) -> None:
        group = self.param_groups[g.index]
        params = g.params
        gi = g.index
        # Gradients: rebind those that moved (checked first: a failing step changes nothing).
        if not self._optfuse_sparse:
            # (torch's .grad setter and autograd already give the param's shape and device.)
            gd = g.grad_dtype
            grads = [p.grad for p in params]
            try:
                ok = all(gr.dtype is gd and gr.is_contiguous() for gr in grads)
            except RuntimeError:  # a sparse gradient has no is_contiguous
                ok = False
            if not ok:
                for k, gr in enumerate(grads):
                    p = params[k]
                    if gr.dtype != gd or gr.shape != p.shape or gr.device != p.device or \
                            gr.is_sparse or not gr.is_contiguous():
                        self._optfuse_bad_grad(gi, g.active[k], p, gr, gd)
            b.core.set_grads(g.cpp, [gr.data_ptr() for gr in grads])
        # Hyperparameters: those that changed since the last step.
        synced = g.synced
        changed = False
        old_block = synced.get("block_size", _state8.DEFAULT_BLOCK)
        blocking = tuple(synced.get(k) for k in _state8.BLOCKING_KEYS)
        for key in g.keys:
            if key not in group:
                continue
            v = group[key]
            if isinstance(v, (torch.Tensor, tuple, list)):
                v = _plain(v)
            if synced.get(key) != v:
                b.core.set(g.cpp, key, v)
                synced[key] = v
                changed = True
        if changed and (b.core.state_spec(g.cpp) != g.spec or
                        tuple(synced.get(k) for k in _state8.BLOCKING_KEYS) != blocking):
            # the structure changed (e.g. amsgrad, state_dtype, block_size)
            try:
                b.bind_state(self, g, old_block)
            except Exception:
                self._optfuse_binding = None  # the C++ side took the new options: start over
                raise

    _optfuse_sparse = False

    @staticmethod
    def _optfuse_bad_grad(gi, pi, p, gr, gd):
        who = _name(gi, pi, p)
        if gr.is_sparse:
            raise RuntimeError(f"{who}: the gradient is sparse; only SparseAdam takes sparse "
                               "gradients")
        if gr.device != p.device:
            raise RuntimeError(f"{who}: the gradient is on {gr.device}, the param on {p.device}")
        if gr.shape != p.shape:
            raise RuntimeError(f"{who}: the gradient has shape {tuple(gr.shape)}")
        if gr.dtype != gd:
            raise TypeError(f"{who}: the gradient is {gr.dtype} but this group's gradients were "
                            f"{gd} when it was bound (one grad dtype per group)")
        raise ValueError(f"{who}: the gradient is not contiguous (strides {gr.stride()})")
