"""Binding torch params, gradients and ``optimizer.state`` to a C++ optimizer.

This is the slow path: it runs at the first step, and again when the set of params with a
gradient, the groups, the state dicts or a param's memory change (C++ says when: see
``python/src/torch_step.h``, which does every step's checks and syncs). It

1. sorts each torch group's params with a gradient into C++ groups, one per dtype (one kernel
   per dtype within a torch group, as torch's fused kernels group by dtype);
2. chooses how each param's values reach the kernels (``DIRECT``: its memory, contiguous or
   dense in another dim order with its state in the same strides; ``DTENSOR``: a DTensor's local
   shard, for FSDP2; ``STAGED``: a contiguous copy of a param that is not dense);
3. makes every missing state tensor with torch's initial values, in the param's layout, and
   binds torch's state tensors as the kernels' buffers (the one copy of the state);
4. builds the ``_core.TorchStep`` that runs each step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import torch

from .. import _core
from .._engine import engine
from . import _state8

if TYPE_CHECKING:
    from ._fused import FusedOptimizer

DTYPE_NAMES = {
    torch.float32: "f32",
    torch.bfloat16: "bf16",
    torch.float16: "f16",
    torch.float64: "f64",
}
TORCH_DTYPES = {
    "f32": torch.float32,
    "bf16": torch.bfloat16,
    "f16": torch.float16,
    "u8": torch.uint8,
    "f64": torch.float64,
}
# ParamMode in python/src/torch_step.h.
DIRECT, DTENSOR, STAGED = 0, 1, 2
# Optimizer-owned state a torch checkpoint does not hold (made again when missing).
_OWN_STATE = ("master", "grad_accum")


def name_of(gi: int, pi: int, p: torch.Tensor) -> str:
    return f"param group {gi}, param {pi} (shape {tuple(p.shape)}, {p.dtype})"


def plain(value):
    """A hyperparameter as the C++ side takes it: tensors (and numpy scalars) as numbers, tuples
    as lists."""
    if isinstance(value, torch.Tensor) or hasattr(value, "item"):
        return value.item()
    if isinstance(value, (tuple, list)):
        return [plain(v) for v in value]
    return value


def scalar_dtype() -> torch.dtype:
    """The dtype of torch's 0-d optimizer state (torch.optim.optimizer._get_scalar_dtype)."""
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32


def scalar_initial(initial, group: dict) -> float:
    """A scalar state's initial value: a number, or a function of the param's group (ASGD's eta
    starts at the group's lr when the param's state is made)."""
    return float(plain(initial(group) if callable(initial) else initial))


def own_shape(shape, work: torch.Tensor) -> bool:
    """Whether a state buffer of `shape` (its spec's) has a shape other than the tensor the
    kernels update (`work`: the param, or under FSDP2 its local shard, whose shape the spec has):
    8-bit state's scales, Adafactor's row_var and col_var."""
    return tuple(shape) != tuple(work.shape) and not (work.dim() == 0 and tuple(shape) == (1,))


def is_dtensor(t) -> bool:
    """A DTensor (torch.distributed.tensor), recognized without importing torch.distributed."""
    return hasattr(t, "_local_tensor") and hasattr(t, "placements")


def local(t: torch.Tensor) -> torch.Tensor:
    """What the kernels see of `t`: a DTensor's local shard, else `t`."""
    return t._local_tensor if is_dtensor(t) else t


def is_dense(t: torch.Tensor) -> bool:
    """Whether `t`'s elements fill its memory range exactly once (some order of its dims is
    contiguous), so that a step can run over that range as one flat array."""
    expected = 1
    for stride, size in sorted((s, n) for s, n in zip(t.stride(), t.shape) if n != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether `a` and `b` (of one shape) put each element at the same offset."""
    return tuple(a.shape) == tuple(b.shape) and all(
        sa == sb for sa, sb, n in zip(a.stride(), b.stride(), a.shape) if n > 1
    )


def param_mode(p: torch.Tensor, contiguous: bool) -> int:
    """How `p` reaches the kernels. A dense param in another dim order runs in place when dim 0
    stays outermost (channels_last): the kernels' rows (gradient centralization, per-row rules)
    are then still its rows. `contiguous`: the kernel needs the contiguous order (8-bit state
    keeps its codes in it; Adafactor's factored kernel reads the matrices of the last two dims)."""
    if is_dtensor(p):
        return DTENSOR
    if p.is_contiguous():
        return DIRECT
    outermost = p.dim() == 0 or p.stride(0) * p.shape[0] == p.numel() or p.shape[0] == 1
    return DIRECT if is_dense(p) and outermost and not contiguous else STAGED


# New host state of this many bytes or more starts at its own offset within a 4 KiB page
# (_staggered). The 16-bit AdamW loop on CPUs without AVX512-BF16 ran 5-7% slower with its state
# at the same page offset as its param and grad, as torch's allocator puts every large tensor
# (bench/README.md, "State at its own page offset"); small tensors' loops are too short to show it.
STAGGER_BYTES = 1 << 20


def _staggered(p: torch.Tensor, dtype: torch.dtype, slot: int) -> torch.Tensor:
    """A new tensor of `p`'s shape and contiguous layout in `dtype`, on the host, whose first
    byte lies (slot + 1) KiB past `p`'s within a 4 KiB page (slot 3 shares p's offset): a view of
    a buffer up to 4 KiB longer. Elsewhere (a device, small or non-contiguous `p`) empty_like."""
    size = dtype.itemsize
    if p.device.type != "cpu" or not p.is_contiguous() or p.numel() * size < STAGGER_BYTES:
        return torch.empty_like(p, dtype=dtype)
    spare = 4096 // size
    flat = torch.empty(p.numel() + spare, dtype=dtype)
    skip = ((p.data_ptr() + 1024 * (slot + 1) - flat.data_ptr()) % 4096) // size
    return flat[skip : skip + p.numel()].view(p.shape)


def _filled(t: torch.Tensor, value: float) -> torch.Tensor:
    """`t` (new, untouched) filled with `value`, as torch.full would make it."""
    # Large new host state asks for transparent huge pages before its first write where
    # huge_pages_for_new_state says so (OPTFUSE_HUGE_PAGES=1, include/optfuse/optim.h). (A
    # DTensor's local shard is made by torch's dispatch: only plain tensors have our pointer.)
    if (
        type(t) is torch.Tensor
        and t.device.type == "cpu"
        and _core.huge_pages_for_new_state(t.nbytes)
    ):
        _core.advise_huge_pages(t.data_ptr(), t.nbytes)
    return t.fill_(value)


class Group:
    """The params of one dtype of one torch param group, as one C++ group."""

    __slots__ = (
        "index",
        "cpp",
        "params",
        "active",
        "works",
        "modes",
        "keys",
        "synced",
        "spec",
        "sparse_keep",
        "states",
    )

    def __init__(self, index, cpp, keys):
        self.index = index  # position in optimizer.param_groups
        self.cpp = cpp  # position among the C++ groups
        self.params: list = []  # the torch params, in group order
        self.active: list = []  # their positions in the group's "params"
        self.works: list = []  # what the kernels update for each (param, local shard, copy)
        self.modes: list = []
        self.keys = keys  # the group's keys the C++ rule takes
        self.synced: dict = {}  # key -> value C++ holds (torch_step.cpp keeps it up to date)
        self.spec: list = []
        self.sparse_keep: list = []  # this step's coalesced sparse gradients (SparseAdam)
        self.states: list = []  # the optimizer.state dict of each param, as bound


class Binding:
    """A C++ optimizer over the params that have gradients, torch's state bound, and the
    ``TorchStep`` that runs each step."""

    def __init__(self, opt: "FusedOptimizer", cuda: bool):
        self.cuda = cuda
        self.core = _core.Optimizer(engine(cuda), opt._optfuse_config())
        self.groups: list[Group] = []
        # The storage of every tensor the C++ optimizer reads or writes, kept alive while it may
        # (a state tensor replaced in optimizer.state, or given new .data, is not freed under it).
        self.keep: list = []
        self.idle_steps: list = []  # state['step'] of params with no elements here (FSDP2)
        known = set(opt._optfuse_group_keys())
        bound = []  # torch_step's BoundParam tuples
        idle = []  # params with a gradient but no elements here
        for gi, group in enumerate(opt.param_groups):
            keys = [k for k in group if k in known] + [
                k for k in _state8.BLOCKING_KEYS if k in known and k not in group
            ]
            synced = {k: plain(group[k]) for k in keys if k in group}
            blocked = synced.get("state_dtype") == "int8"
            by_dtype: dict = {}
            for pi, p in enumerate(group["params"]):
                if p.grad is None:
                    continue
                if local(p).numel() == 0:
                    idle.append(p)
                    continue
                # One C++ group per (param dtype, gradient dtype) of the torch group.
                kind = (p.dtype, local(p.grad).dtype if not opt._optfuse_sparse else None)
                g = by_dtype.get(kind)
                if g is None:
                    g = by_dtype[kind] = Group(gi, len(self.groups) + len(by_dtype), keys)
                    g.synced = dict(synced)
                g.params.append(p)
                g.active.append(pi)
            for g in sorted(by_dtype.values(), key=lambda g: g.cpp):
                entries = []
                for pi, p in zip(g.active, g.params):
                    factored = opt._optfuse_factored and p.dim() >= 2
                    mode = param_mode(p, blocked or factored)
                    if mode == DTENSOR and factored:
                        raise ValueError(
                            f"{name_of(gi, pi, p)}: {type(opt).__name__} factors the "
                            "second moment of a matrix over its rows and columns, "
                            "but under FSDP2 each rank holds a shard of it: not "
                            "supported (use torch.optim's)"
                        )
                    work = (
                        local(p)
                        if mode != STAGED
                        else torch.empty(p.shape, dtype=p.dtype, device=p.device)
                    )
                    g.modes.append(mode)
                    g.works.append(work)
                    who = name_of(gi, pi, p)
                    grad_ptr, grad_dtype = 0, "f32"
                    if not opt._optfuse_sparse:
                        grad_ptr, grad_copy, grad_dtype = _core.grad_for_kernels(
                            p, work, mode == DTENSOR, who
                        )
                        if grad_copy is not None:
                            self.keep.append(grad_copy)
                    entries.append(
                        (
                            work.data_ptr(),
                            grad_ptr,
                            work.numel(),
                            list(work.shape),
                            DTYPE_NAMES[p.dtype],
                            grad_dtype,
                            who,
                        )
                    )
                    bound.append(
                        (p, work, gi, pi, g.cpp, len(entries) - 1, mode, grad_dtype, grad_ptr, who)
                    )
                    self.keep.append(work.untyped_storage())
                self.core.add_param_group(entries, g.synced, cuda)
                self.groups.append(g)
        for g in self.groups:
            self.bind_state(opt, g)
        for p in idle:
            opt._optfuse_idle_state(p, self)
        self.fast = _core.TorchStep(
            self.core,
            bound,
            [(g.index, g.keys, g.synced) for g in self.groups],
            self.idle_steps,
            not opt._optfuse_sparse,
            opt.param_groups,
            opt.state,
        )

    def restate(self, opt: "FusedOptimizer", k: int, old_block: Optional[int]) -> bool:
        """Rebinds the state of C++ group `k`, whose buffers changed with its options; False if
        the group needs a new binding instead (8-bit state for a param updated in place in
        another dim order: its codes keep the contiguous order)."""
        g = self.groups[k]
        if g.synced.get("state_dtype") == "int8" and any(
            m == DIRECT and not w.is_contiguous() for m, w in zip(g.modes, g.works)
        ):
            return False
        self.bind_state(opt, g, _state8.DEFAULT_BLOCK if old_block is None else old_block)
        self.fast.restated(k, opt.state)
        return True

    def bind_state(self, opt: "FusedOptimizer", g: Group, old_block: Optional[int] = None) -> None:
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

            changes.append(
                _state8.conversions(
                    opt.state[p],
                    specs[k],
                    old_block,
                    block,
                    name_of(g.index, g.active[k], p),
                    initial,
                )
            )
        for k, p in enumerate(g.params):
            self._check_complete(opt, g, k, p, specs[k])
        for k, p in enumerate(g.params):
            st = opt.state[p]
            g.states.append(st)
            self._bind_tensor(opt, g, k, p, st, specs[k], changes[k], fresh)

    @staticmethod
    def _check_complete(opt, g: Group, k: int, p, spec) -> None:
        """KeyError if `p`'s state came from elsewhere (a checkpoint) without a buffer the step
        needs, as torch's own step raises; state that optfuse began itself is completed."""
        st = opt.state[p]
        made_here = opt._optfuse_fresh
        if not any(isinstance(v, torch.Tensor) and id(v) not in made_here for v in st.values()):
            return
        names = [s[0] for s in spec] + [n for n, _ in opt._optfuse_scalar_state()]
        lazy = opt._optfuse_lazy_state
        for name in names:
            base = name[: -len(_state8.SCALES)] if name.endswith(_state8.SCALES) else name
            if name not in st and base not in st and name not in _OWN_STATE and name not in lazy:
                raise KeyError(
                    f"{name_of(g.index, g.active[k], p)}: its state has no "
                    f"'{name}' (it has {sorted(st)}): the checkpoint was made by "
                    "another optimizer or with other options"
                )

    def _bind_tensor(self, opt, g: Group, k: int, p, st: dict, spec, change, fresh) -> None:
        """Binds tensor `k` of `g`: its state buffers (made where missing) and scalars."""
        mode, work = g.modes[k], g.works[k]
        if "master" not in {s[0] for s in spec}:
            # master_weights=False: the param is the value (a kept copy would be stale if
            # master weights came back), and state_dict() is then torch's own layout.
            st.pop("master", None)
        converted, new = change
        for name, t in converted.items():
            if t is None:
                st.pop(name, None)
            else:
                st[name] = t
                if name in new:
                    fresh.add(id(t))
        where = name_of(g.index, g.active[k], p)
        for slot, (name, dtype, initial, from_param, numel, shape) in enumerate(spec):
            want = TORCH_DTYPES[dtype]
            t = st.get(name)
            made = t is None
            if made:
                t = opt._optfuse_initial_state(p, name, want)
            if made and t is not None:  # the optimizer's own initial value (from_rule)
                t = self._checked_state(t, p, work, mode, name, want, where)
                fresh.add(id(t))
            elif made:
                if from_param:  # the f32 master copy of a 16-bit param
                    if mode == DIRECT:
                        t = _staggered(p, want, slot).copy_(p.detach())
                    else:
                        t = p.detach().to(dtype=want, copy=True)
                    if mode == STAGED:
                        t = t.contiguous()
                elif own_shape(shape, work):  # 8-bit scales, Adafactor's row_var / col_var
                    t = _filled(torch.empty(shape, dtype=want, device=work.device), initial)
                    fresh.add(id(t))
                else:  # in the param's layout (torch: zeros_like(p, preserve_format))
                    t = _filled(
                        _staggered(p, want, slot)
                        if mode == DIRECT
                        else torch.empty_like(p, dtype=want)
                        if mode != STAGED
                        else torch.empty(p.shape, dtype=want, device=p.device),
                        initial,
                    )
                    fresh.add(id(t))  # new state until a step is applied with it
            else:
                t = self._checked_state(t, p, work, mode, name, want, where, shape)
            st[name] = t
            buf = local(t)
            self.keep.append(buf.untyped_storage())
            self.core.bind_state(g.cpp, k, name, buf.data_ptr(), buf.numel(), dtype, id(t) in fresh)
        for name, initial in opt._optfuse_scalar_state():
            s = st.get(name)
            if not (
                isinstance(s, torch.Tensor)
                and s.device.type == "cpu"
                and s.dim() == 0
                and s.dtype in (torch.float32, torch.float64)
            ):
                if s is None:
                    s = scalar_initial(initial, opt.param_groups[g.index])
                s = torch.tensor(float(plain(s)), dtype=scalar_dtype())
                st[name] = s
            self.keep.append(s.untyped_storage())
            self.core.bind_scalar(
                g.cpp, k, name, s.data_ptr(), "f64" if s.dtype == torch.float64 else "f32"
            )

    @staticmethod
    def _checked_state(t, p, work, mode, name, want, where, shape=None) -> torch.Tensor:
        """A state tensor from the user or a checkpoint, as the kernel needs it: its dtype and
        device, and the layout of what the kernels update (the param's, or contiguous; state of
        a shape of its own, contiguous)."""
        where = f"{where}: state '{name}'"
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{where} is a {type(t).__name__}, not a tensor")
        if shape is not None and own_shape(shape, work):
            if tuple(t.shape) != tuple(shape):
                why = (
                    "one scale per block (was it made with another block_size?)"
                    if name.endswith(_state8.SCALES)
                    else "one value per row or column of each matrix of the param's last two dims"
                )
                raise ValueError(
                    f"{where} has shape {tuple(t.shape)}, the state needs {tuple(shape)}: {why}"
                )
            if t.dtype != want or t.device != work.device or not t.is_contiguous():
                t = t.to(
                    dtype=want, device=work.device, memory_format=torch.contiguous_format, copy=True
                )
            return t
        if t.shape != p.shape:
            raise ValueError(f"{where} has shape {tuple(t.shape)}, the param {tuple(p.shape)}")
        if mode == DTENSOR:
            if not is_dtensor(t):
                raise ValueError(
                    f"{where} is a {type(t).__name__} but the param a DTensor: "
                    "load sharded state through torch.distributed.checkpoint"
                )
            if t.dtype != want or not same_layout(local(t), work):
                t = torch.empty_like(p, dtype=want).copy_(t)
            return t
        if mode == STAGED:
            layout_ok = t.is_contiguous()
        else:
            layout_ok = same_layout(t, p) and is_dense(t)
        if t.dtype != want or t.device != p.device or not layout_ok:
            fresh = (
                torch.empty_like(p, dtype=want)
                if mode != STAGED
                else torch.empty(p.shape, dtype=want, device=p.device)
            )
            t = fresh.copy_(t)
        return t
