"""The optfuse graph a captured rule becomes, built node by node (docs/graph-json.md).

``_aten.convert_graph`` emits into a ``_Builder``: each id keeps its dtype and whether it is
uniform (scalars and constants only), constant-only arithmetic is folded in double, and the
result is the JSON form ``optfuse.torch.Custom`` takes.
"""

from __future__ import annotations

import math
import operator
from typing import Any

import torch

_DTYPES = {
    torch.float32: "f32",
    torch.float64: "f64",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.bool: "bool",
}

# Folding of constant-only arithmetic (a user's `torch.tensor(2.0).sqrt()`), in double.
_FOLD = {
    "add": operator.add,
    "sub": operator.sub,
    "mul": operator.mul,
    "div": operator.truediv,
    "pow": operator.pow,
    "neg": operator.neg,
    "abs": abs,
    "min": min,
    "max": max,
    "sqrt": math.sqrt,
    "rsqrt": lambda x: 1 / math.sqrt(x),
    "exp": math.exp,
    "log": math.log,
    "sign": lambda x: float((x > 0) - (x < 0)),
}

# Ops that take bool operands as they are.
_LOGICAL = ("select", "cast", "eq", "ne", "is_finite")


class _Builder:
    """The optfuse graph under construction, with each id's dtype."""

    def __init__(self, name: str):
        self.name = name
        self.inputs, self.scalars, self.nodes = [], [], []
        self.outputs: dict = {}
        self.dtype: dict = {}
        self.by_id: dict = {}
        self.uniform: dict = {}  # id -> True when the value is the same for every element
        self.rows: list = []  # per-row reductions: "op at line" (capture.py checks shapes)

    def emit(self, op: str, *args, dtype: str = None) -> Any:
        if all(isinstance(a, (int, float)) for a in args) and op in _FOLD:
            return float(_FOLD[op](*args))
        ids = [a for a in args if isinstance(a, str)]
        if (
            op in ("add", "mul")
            and len(ids) == 2 == len(args)
            and all(self.dtype[a] == "bool" for a in ids)
        ):
            # bool * bool is "and", bool + bool "or" in torch (isfinite decomposes so).
            x, y = args
            return self.emit("select", x, y, x) if op == "mul" else self.emit("select", x, x, y)
        if op not in _LOGICAL and any(self.dtype[a] == "bool" for a in ids):
            args = tuple(
                self.cast(a, "f32") if isinstance(a, str) and self.dtype[a] == "bool" else a
                for a in args
            )  # torch promotes bool to float here
        if any(isinstance(a, float) and not math.isfinite(a) for a in args):
            # (JSON has no inf or nan number: a const node, in the other operand's dtype.)
            t = next((self.dtype[a] for a in args if isinstance(a, str)), "f32")
            args = tuple(
                self.const(a, t) if isinstance(a, float) and not math.isfinite(a) else a
                for a in args
            )
        if op == "add":
            flipped = self._minus(*args)
            if flipped is not None:
                return flipped
        ids = [a for a in args if isinstance(a, str)]
        if op == "select":
            ids = [a for a in args[1:] if isinstance(a, str)]
        if (
            op not in ("cast", "select")
            and not op.startswith(("reduce_", "row_"))
            and len({self.dtype[a] for a in ids}) > 1
        ):
            want = "f64" if any(self.dtype[a] == "f64" for a in ids) else "f32"
            args = tuple(self.cast(a, want) if isinstance(a, str) else a for a in args)
            ids = [a for a in args if isinstance(a, str)]
        if op == "select" and len({self.dtype[a] for a in ids}) > 1:
            args = (args[0],) + tuple(
                self.cast(a, "f32") if isinstance(a, str) else a for a in args[1:]
            )
        i = f"%{len(self.nodes)}"
        node = {"id": i, "op": op, "args": [self.ref(a) for a in args]}
        if op == "cast":
            node["dtype"] = dtype
        self.nodes.append(node)
        self.by_id[i] = node
        if op == "cast":
            self.dtype[i] = dtype
        elif op in ("lt", "le", "gt", "ge", "eq", "ne", "is_finite"):
            self.dtype[i] = "bool"
        elif op == "select":
            self.dtype[i] = self.dtype[ids[0]] if ids else "f32"
        else:
            self.dtype[i] = self.dtype[ids[0]] if ids else "f32"
        self.uniform[i] = op.startswith("reduce_") or all(
            self.uniform.get(a, True) for a in args if isinstance(a, str)
        )
        return i

    def _minus(self, a, b):
        """x + (-u) * y as x - u * y (u uniform: a negative number, neg(v), neg(v) / w), the
        library's spelling; bit-identical, as x + (-z) is x - z and a sign flip commutes with
        rounding. None when neither operand is such a product."""
        for x, m in ((a, b), (b, a)):
            n = self.by_id.get(m) if isinstance(m, str) else None
            if n is None or n["op"] != "mul":
                continue
            for f, rest in ((n["args"][0], n["args"][1]), (n["args"][1], n["args"][0])):
                if isinstance(f, str) and not self.uniform.get(f, False):
                    continue
                pos = self.positive(f)
                if pos is not None:
                    term = (
                        rest
                        if isinstance(pos, float) and pos == 1.0
                        else self.emit("mul", pos, rest)
                    )
                    return self.emit("sub", x, term)
        return None

    def positive(self, a):
        """-a when `a` is a negative number or a uniform negation (neg(u), neg(u) / w), else
        None."""
        if isinstance(a, (int, float)):
            return -float(a) if a < 0 else None
        n = self.by_id.get(a)
        if n is None or not self.uniform.get(a, False):
            return None
        if n["op"] == "neg":
            return n["args"][0]
        if n["op"] in ("div", "mul"):
            inner = self.positive(n["args"][0])
            if inner is not None:
                return self.emit(n["op"], inner, n["args"][1])
        return None

    def ref(self, a):
        if isinstance(a, bool):
            return 1.0 if a else 0.0
        return a

    def const(self, v: float, dtype: str = "f32") -> str:
        i = f"%{len(self.nodes)}"
        self.nodes.append({"id": i, "const": _const_text(v), "dtype": dtype})
        self.dtype[i], self.uniform[i] = dtype, True
        return i

    def cast(self, a, dtype: str):
        if not isinstance(a, str) or self.dtype[a] == dtype:
            return a
        return self.emit("cast", a, dtype=dtype)

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "inputs": self.inputs,
            "scalars": self.scalars,
            "nodes": self.nodes,
            "outputs": self.outputs,
        }


def _const_text(v: float):
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return v
