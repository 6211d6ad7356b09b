"""The tracer behind captured rules: runs a rule once under torch's dispatcher and records the aten
ops it reaches, as a ``torch.fx.Graph`` that ``_aten.convert_graph`` turns into optfuse's graph.

It is the mechanism ``make_fx`` is built on (a ``TorchDispatchMode`` sees every aten op with its
overload, after torch's Python layer has resolved methods, operators and keyword defaults),
with three differences that keep a capture in milliseconds and exact:

* Real example tensors (small, zeros), not fake or meta ones. In torch 2.15 ``make_fx``,
  ``FakeTensorMode`` and every meta kernel written in Python import ``torch._dynamo`` on first
  use (1.5-4 s here); CPU kernels do not. The values are never read: only which ops run.
* In-place writes are followed by storage: every tensor is known by (storage, offset, shape,
  strides), so ``p.add_(...)``, ``p.data.add_(...)`` and ``m.mul_(b).add_(g)`` all rebind the
  argument they write; at the end each argument whose value changed gets a write-back node
  (``WRITEBACK``), which becomes the graph output that replaces it. Ops that make views (another
  shape or offset on the same storage) are recorded and refused by the converter, so a write
  through a view can never be lost silently.
* Scalars are 0-dim tensors. A Python number made of one (``float(lr)``, ``math.sqrt(bc)``,
  ``if lr > 0:``) reaches ``aten._local_scalar_dense`` and is an error at the user's line. torch's
  argument parser would do the same for a tensor passed as a Scalar argument (``alpha=``,
  ``value=``), so those calls are rewritten first (``_ScalarArguments``): ``x.add_(y, alpha=a)``
  becomes ``x.add_(y * a)``, the same maths.
"""

from __future__ import annotations

import linecache
import os
import sys
from typing import Any, Callable

import torch
import torch.fx
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from ._aten import WRITEBACK, CaptureError

aten = torch.ops.aten
_TORCH_DIR = os.path.dirname(torch.__file__)
_OWN_DIR = os.path.dirname(os.path.abspath(__file__))
_TO_NUMBER = (aten._local_scalar_dense.default, aten.is_nonzero.default, aten.item.default)


def _user_frame(fn: Callable):
    """(file, line, function, source) of the innermost frame of the user's code on the stack
    (not torch's, not optfuse's), preferring a frame of `fn` itself; None if there is none."""
    code = getattr(fn, "__code__", None)
    frame, best = sys._getframe(1), None
    while frame is not None:
        f = frame.f_code.co_filename
        if frame.f_code is code:
            best = frame
            break
        if best is None and not f.startswith((_TORCH_DIR, _OWN_DIR)) and not f.startswith("<"):
            best = frame
        frame = frame.f_back
    if best is None:
        return None
    f, n = best.f_code.co_filename, best.f_lineno
    return f, n, best.f_code.co_name, linecache.getline(f, n).strip()


def user_line(fn: Callable) -> str:
    """The user's line as an fx node's stack_trace ('File "f", line N, in name\n    source')."""
    u = _user_frame(fn)
    return f'File "{u[0]}", line {u[1]}, in {u[2]}\n    {u[3]}' if u else ""


def location(fn: Callable) -> str:
    """The user's line as 'file:line: source', or ''."""
    u = _user_frame(fn)
    return f"{u[0]}:{u[1]}: {u[3]}" if u else ""


def _key(t: torch.Tensor):
    return (t.untyped_storage()._cdata, t.storage_offset(), tuple(t.shape), t.stride())


class _ScalarArguments(TorchFunctionMode):
    """Rewrites calls that pass a tensor where torch takes a Python number (``alpha=``,
    ``value=``) into the same maths on tensors, before torch's argument parser would make it a
    number (an error for a rule's scalars: see the module doc)."""

    _ALPHA = {"add", "add_", "sub", "sub_"}
    _VALUE = {"addcmul": "mul", "addcmul_": "mul", "addcdiv": "div", "addcdiv_": "div"}

    @classmethod
    def _should_skip_dynamo(cls) -> bool:  # (as _Recorder: a capture never runs under dynamo)
        return False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        name = getattr(func, "__name__", "")
        if name in self._ALPHA and isinstance(kwargs.get("alpha"), torch.Tensor):
            alpha = kwargs.pop("alpha")
            x, rest = args[0], list(args[1:])
            other = rest.pop(0) if rest else kwargs.pop("other")
            return func(x, torch.mul(other, alpha), *rest, **kwargs)
        if name in self._VALUE and isinstance(kwargs.get("value"), torch.Tensor):
            value = kwargs.pop("value")
            s, t1, t2 = (list(args) + [kwargs.pop("tensor1", None), kwargs.pop("tensor2", None)])[
                :3
            ]
            term = torch.mul(getattr(torch, self._VALUE[name])(t1, t2), value)
            return s.add_(term) if name.endswith("_") else torch.add(s, term)
        return func(*args, **kwargs)


class _Recorder(TorchDispatchMode):
    """Records every aten op into `graph`; tensors are known by storage (``_key``)."""

    def __init__(self, graph: torch.fx.Graph, fn: Callable):
        super().__init__()
        self.graph, self.fn = graph, fn
        self.nodes: dict = {}  # _key(tensor) -> the fx node of its current value

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch wraps __torch_dispatch__ in torch._disable_dynamo unless this says False; that
        # wrapper imports torch._dynamo at the first op (seconds). A capture never runs under
        # torch.compile, so there is nothing to disable.
        return False

    def arg(self, a, fresh: bool = False):
        """`a` with its tensors as fx nodes; `fresh`: the operand of lift_fresh, a tensor the
        rule made from Python numbers (torch.tensor(2.0)): a constant."""
        if isinstance(a, torch.Tensor):
            node = self.nodes.get(_key(a))
            if node is not None:
                return node
            if fresh and a.numel() == 1:
                return a.item() if a.dtype != torch.bool else bool(a.item())
            raise CaptureError(
                f"{self.where()}a tensor that is neither an argument of the rule "
                "nor computed from them (a global, or a closure's tensor) is used "
                f"there (shape {tuple(a.shape)}): its value would be baked in; "
                "make it an option (a scalar) or state"
            )
        if isinstance(a, (list, tuple)):
            return type(a)(self.arg(x, fresh) for x in a)
        return a

    def where(self) -> str:
        at = location(self.fn)
        return f"rule {getattr(self.fn, '__name__', 'rule')!r}" + (f" at {at}: " if at else ": ")

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _TO_NUMBER:
            raise CaptureError(_to_number_message(self.fn))
        out = func(*args, **kwargs)
        if not isinstance(func, torch._ops.OpOverload) or func.namespace != "aten":
            return out  # prim.device and the like: no values
        fresh = func in (aten.lift_fresh.default, aten.lift_fresh_copy.default)
        node = self.graph.create_node(
            "call_function",
            func,
            self.arg(tuple(args), fresh),
            {k: self.arg(v) for k, v in kwargs.items()},
        )
        node.meta["val"] = out
        node.meta["stack_trace"] = user_line(self.fn)
        if isinstance(out, torch.Tensor):
            self.nodes[_key(out)] = node
        elif isinstance(out, (tuple, list)):  # (max.dim's values and indices): refused later
            for i, o in enumerate(out):
                if isinstance(o, torch.Tensor):
                    self.nodes[_key(o)] = node
        return out


def _to_number_message(fn: Callable) -> str:
    at = location(fn)
    at = f" at {at}" if at else ""
    return (
        f"rule {getattr(fn, '__name__', 'rule')!r}{at}: a scalar (a hyperparameter or the "
        "step) was made a Python number or a Python bool there (float(), math.*, .item(), "
        "`if`, `and` / `or`): optfuse keeps scalars as runtime values, so write it with "
        "torch ops (x.sqrt(), x ** 0.5, torch.where, torch.maximum)"
    )


def trace(fn: Callable, names: list, examples: list, call: Callable[[list], Any]):
    """Runs ``call(examples)`` under the recorder. Returns (graph, returned): the fx graph, with
    a placeholder per example (named by `names`), the ops, a WRITEBACK per argument whose value
    changed and an output node of the returned tensors; and what ``call`` returned, with its
    tensors replaced by their fx nodes."""
    graph = torch.fx.Graph()
    rec = _Recorder(graph, fn)
    placeholders = []
    for name, t in zip(names, examples):
        node = graph.placeholder(name)
        node.meta["val"] = t
        rec.nodes[_key(t)] = node
        placeholders.append((node, _key(t)))
    with torch.no_grad(), _ScalarArguments(), rec:
        returned = call(examples)
    for node, key in placeholders:
        current = rec.nodes.get(key)
        if current is not None and current is not node:
            graph.create_node("call_function", WRITEBACK, (node, current))
    out = rec.arg(returned) if returned is not None else ()
    graph.output(out)
    return graph, out
