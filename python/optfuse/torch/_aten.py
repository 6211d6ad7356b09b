"""The aten ops a captured rule may use, and their optfuse graphs (docs/graph-json.md).

``convert_graph`` walks the fx graph ``_tracer.trace`` recorded, node by node. Each
aten op maps to a few optfuse ops with the same maths (``_OPS``); anything else is a
``CaptureError`` naming the op, the user's line that made it and what is accepted. Nothing is
ever dropped or run eagerly instead.

Values are optfuse ids (an input, a scalar or a node ``%N``) or Python numbers (constants, which
take the other operand's dtype in optfuse as in torch). Where torch promotes dtypes implicitly
(``g * (g > 0)``: bool to float) an explicit ``cast`` is inserted, since optfuse's binary ops
need equal dtypes.
"""

from __future__ import annotations

import math
import operator
from typing import Any

import torch

from ._graph_builder import _DTYPES, _Builder

aten = torch.ops.aten


class CaptureError(ValueError):
    """A rule that cannot be captured: says what, where (the line of the rule) and why."""


CaptureError.__module__ = "optfuse.torch"  # where users meet it


def WRITEBACK(target, value):  # noqa: N802  (an fx node target, never called)
    """Marks `value` as the new value of argument `target`: _tracer.py adds one per argument
    the rule changed, and it becomes the graph output that replaces the argument."""
    raise AssertionError("a traced graph is converted, never run")


ACCEPTED = (
    "add, sub, rsub, mul, div, neg, abs, sign, sgn, sqrt, rsqrt, reciprocal, square, "
    "exp, log, pow, maximum, minimum, clamp, clamp_min, clamp_max, where, lt, le, gt, "
    "ge, eq, ne, isfinite, lerp, addcmul, addcdiv, casts (.to, .float()), copy_, clone, "
    "zeros_like / ones_like / full_like, and sum, mean, amax, amin, max, min, norm over "
    "the whole tensor or over every dim but the first (keepdim=True)"
)


def _line(node) -> str:
    """The user's line that made fx node `node` ('file:line: source'), or ''."""
    st = node.meta.get("stack_trace") or ""
    lines = [s for s in st.strip().splitlines() if s.strip()]
    for k in range(len(lines) - 1, -1, -1):
        s = lines[k].strip()
        if s.startswith("File "):
            parts = s.split(",")
            file = parts[0][len("File ") :].strip().strip('"')
            num = parts[1].strip().split()[-1] if len(parts) > 1 else "?"
            src = lines[k + 1].strip() if k + 1 < len(lines) else ""
            return f"{file}:{num}: {src}"
    return ""


def _unsupported(b: _Builder, node, why: str = "") -> CaptureError:
    line = _line(node)
    at = f" at {line}" if line else ""
    t = node.target
    op = getattr(t, "__name__", str(t))
    if isinstance(t, torch._ops.OpOverload):
        op = f"{op.split('.')[0]} (aten.{op})"
    why = f" ({why})" if why else ""
    return CaptureError(
        f"rule {b.name!r}{at}: optfuse cannot capture {op}{why}. A captured rule "
        f"is element-wise; it may use {ACCEPTED}."
    )


def _shape(x) -> tuple:
    v = x.meta.get("val") if hasattr(x, "meta") else None
    return tuple(v.shape) if isinstance(v, torch.Tensor) else ()


def _reduction(b: _Builder, node, env, kind: str, x, dims, keepdim: bool, post=None):
    """`kind` (sum, mean, max, min) of `x` over `dims` (None: all)."""
    a = env(x)
    shape = _shape(x)
    nd = len(shape)
    if isinstance(dims, int):
        dims = [dims]
    dims = sorted({d % nd for d in dims}) if dims and nd else list(range(nd))
    if not isinstance(a, str) or b.uniform.get(a, False):
        return a  # a reduction of a uniform value (a 0-dim scalar) is the value
    if dims == list(range(nd)):
        return b.emit(f"reduce_{kind}", a)
    if nd >= 2 and dims == list(range(1, nd)):
        if not keepdim:
            raise _unsupported(
                b,
                node,
                f"a reduction over dims {dims} needs keepdim=True: "
                "optfuse gives every element its row's value",
            )
        b.rows.append(f"{getattr(node.target, '__name__', node.target)} at {_line(node)}")
        return b.emit(f"row_{kind}", a)
    raise _unsupported(
        b,
        node,
        f"a reduction over dims {dims} of a {nd}-D tensor: optfuse "
        "reduces over the whole tensor or over every dim but the first",
    )


def _norm(b, node, env, x, ord_=2, dim=None, keepdim=False, dtype=None):
    if dtype is not None:
        raise _unsupported(b, node, "dtype= of a norm")
    a = env(x)
    if ord_ == 2:
        s = _reduction(b, node, lambda _: b.emit("mul", a, a), "sum", x, dim, keepdim)
        return b.emit("sqrt", s)
    if ord_ == 1:
        return _reduction(b, node, lambda _: b.emit("abs", a), "sum", x, dim, keepdim)
    if ord_ == math.inf:
        return _reduction(b, node, lambda _: b.emit("abs", a), "max", x, dim, keepdim)
    raise _unsupported(b, node, f"a norm of order {ord_} (optfuse: 1, 2, inf)")


def _rsqrt(b, x):
    # Of a scalar: 1 / sqrt(x), the spelling whose host formula optfuse knows by name
    # (inv_bias_correction2_sqrt); on the host, in double, either is one rounding from exact.
    if isinstance(x, str) and b.uniform.get(x, False):
        return b.emit("div", 1.0, b.emit("sqrt", x))
    return b.emit("rsqrt", x)


def _pow(b, x, e):
    # torch computes these exponents exactly so (aten pow_tensor_scalar): so does optfuse.
    if isinstance(e, (int, float)) and isinstance(x, str):
        if e == 1:
            return x
        if e == 2:
            return b.emit("mul", x, x)
        if e == 0.5:
            return b.emit("sqrt", x)
        if e == -0.5:
            return _rsqrt(b, x)
        if e == -1:
            return b.emit("div", 1.0, x)
    return b.emit("pow", x, e)


def _scaled(b, v, alpha):
    return v if isinstance(alpha, (int, float)) and alpha == 1 else b.emit("mul", alpha, v)


def _axpy(b, x, alpha, v):
    """x + alpha * v (add's alpha=, addcdiv's value=). A negated alpha (-lr / bc1, -1) becomes
    x - |alpha| * v, the library's spelling: bit-identical in IEEE arithmetic, since a sign
    flip commutes with rounding and x + (-y) is x - y."""
    pos = b.positive(alpha)
    if pos is not None:
        return b.emit("sub", x, _scaled(b, v, pos))
    return b.emit("add", x, _scaled(b, v, alpha))


def _clamp(b, x, lo=None, hi=None):
    if lo is not None:
        x = b.emit("max", x, lo)
    if hi is not None:
        x = b.emit("min", x, hi)
    return x


def _cast_node(b, node, a, dtype=None, **kw):
    if dtype is None:
        return a
    if dtype not in _DTYPES:
        raise _unsupported(b, node, f"a cast to {dtype}")
    return b.cast(a, _DTYPES[dtype])


def _identity(b, x, *rest, **kw):
    return x


# aten op -> function(builder, *converted args, **converted kwargs).
_OPS: dict = {}


def _def(ops, f):
    for op in ops:
        _OPS[op] = f


_def([aten.add.Tensor, aten.add.Scalar], lambda b, x, y, alpha=1: _axpy(b, x, alpha, y))
_def(
    [aten.sub.Tensor, aten.sub.Scalar],
    lambda b, x, y, alpha=1: b.emit("sub", x, _scaled(b, y, alpha)),
)
_def(
    [aten.rsub.Tensor, aten.rsub.Scalar],
    lambda b, x, y, alpha=1: b.emit("sub", y, _scaled(b, x, alpha)),
)
_def([aten.mul.Tensor, aten.mul.Scalar], lambda b, x, y: b.emit("mul", x, y))
_def([aten.div.Tensor, aten.div.Scalar], lambda b, x, y: b.emit("div", x, y))
for _name, _op in (
    ("neg", "neg"),
    ("abs", "abs"),
    ("sign", "sign"),
    ("sgn", "sign"),
    ("sqrt", "sqrt"),
    ("exp", "exp"),
    ("log", "log"),
):
    _def([getattr(aten, _name).default], (lambda o: lambda b, x: b.emit(o, x))(_op))
_def([aten.rsqrt.default], lambda b, x: _rsqrt(b, x))
_def([aten.isfinite.default], lambda b, x: b.emit("is_finite", x))
_def([aten.reciprocal.default], lambda b, x: b.emit("div", 1.0, x))
_def([aten.square.default], lambda b, x: b.emit("mul", x, x))
_def([aten.pow.Tensor_Scalar, aten.pow.Tensor_Tensor], _pow)
_def([aten.pow.Scalar], lambda b, s, x: b.emit("pow", s, x))
_def([aten.maximum.default], lambda b, x, y: b.emit("max", x, y))
_def([aten.minimum.default], lambda b, x, y: b.emit("min", x, y))
_def([aten.clamp.default, aten.clamp.Tensor], _clamp)
_def([aten.clamp_min.default, aten.clamp_min.Tensor], lambda b, x, lo: _clamp(b, x, lo))
_def([aten.clamp_max.default, aten.clamp_max.Tensor], lambda b, x, hi: _clamp(b, x, None, hi))
_def(
    [aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar],
    lambda b, c, x, y: b.emit("select", c, x, y),
)
for _name in ("lt", "le", "gt", "ge", "eq", "ne"):
    _def(
        [getattr(aten, _name).Tensor, getattr(aten, _name).Scalar],
        (lambda o: lambda b, x, y: b.emit(o, x, y))(_name),
    )
# lerp(x, y, w) = x + w * (y - x): torch's formula for w < 0.5, and optfuse's normal form
# (src/graph/idiom_rules.cpp, "lerp").
_def(
    [aten.lerp.Scalar, aten.lerp.Tensor],
    lambda b, x, y, w: b.emit("add", x, b.emit("mul", w, b.emit("sub", y, x))),
)
_def(
    [aten.addcmul.default], lambda b, s, t1, t2, value=1: _axpy(b, s, value, b.emit("mul", t1, t2))
)
_def(
    [aten.addcdiv.default], lambda b, s, t1, t2, value=1: _axpy(b, s, value, b.emit("div", t1, t2))
)
_def(
    [
        aten.clone.default,
        aten.alias.default,
        aten.detach.default,
        aten.lift_fresh_copy.default,
        aten.lift_fresh.default,
        aten._local_scalar_dense.default,
        aten.contiguous.default,
    ],
    _identity,
)
# Python arithmetic on a scalar made a number by torch (alpha=-lr, value=1 - beta2).
for _f, _op in (
    (operator.add, "add"),
    (operator.sub, "sub"),
    (operator.mul, "mul"),
    (operator.truediv, "div"),
    (operator.pow, "pow"),
):
    _def([_f], (lambda o: lambda b, x, y: b.emit(o, x, y))(_op))
_def([operator.neg], lambda b, x: b.emit("neg", x))


def _special(b: _Builder, node, env) -> Any:
    """Ops whose conversion needs the fx node (shapes, dtypes, lines); None if not one."""
    t, args, kw = node.target, node.args, node.kwargs
    if t in (aten.sum.default, aten.sum.dim_IntList, aten.mean.default, aten.mean.dim):
        if kw.get("dtype") is not None or (len(args) > 3 and args[3] is not None):
            raise _unsupported(b, node, "dtype= of a reduction")
        kind = "sum" if t in (aten.sum.default, aten.sum.dim_IntList) else "mean"
        dims = args[1] if len(args) > 1 else kw.get("dim")
        keep = args[2] if len(args) > 2 else kw.get("keepdim", False)
        return _reduction(b, node, env, kind, args[0], dims, keep)
    if t in (aten.amax.default, aten.amin.default, aten.max.default, aten.min.default):
        kind = "max" if t in (aten.amax.default, aten.max.default) else "min"
        dims = args[1] if len(args) > 1 else kw.get("dim", [])
        keep = args[2] if len(args) > 2 else kw.get("keepdim", False)
        return _reduction(b, node, env, kind, args[0], dims, keep)
    if t is aten.linalg_vector_norm.default:
        names = ("ord_", "dim", "keepdim", "dtype")
        extra = dict(zip(names, args[1:]))
        extra.update({("ord_" if k == "ord" else k): v for k, v in kw.items()})
        return _norm(b, node, env, args[0], **extra)
    if t in (aten._to_copy.default, aten.to.dtype):
        bad = {
            k
            for k, v in kw.items()
            if v is not None
            and k
            not in (
                "dtype",
                "layout",
                "device",
                "pin_memory",
                "memory_format",
                "non_blocking",
                "copy",
            )
        }
        if bad:
            raise _unsupported(b, node, f"{sorted(bad)}")
        dtype = kw.get("dtype", args[1] if len(args) > 1 else None)
        return _cast_node(b, node, env(args[0]), dtype)
    if t in (aten.copy.default, aten.copy_.default):  # the source, in the target's dtype
        return b.cast(env(args[1]), _dtype_of(b, node, args[0]))
    if t is aten.zero_.default:
        return b.const(0.0, _dtype_of(b, node, node))
    if t in (aten.fill_.Scalar, aten.fill_.Tensor):
        v = env(args[1])
        return b.const(float(v), _dtype_of(b, node, node)) if isinstance(v, (int, float)) else v
    if t in (aten.zeros_like.default, aten.ones_like.default, aten.full_like.default):
        v = (
            0.0
            if t is aten.zeros_like.default
            else 1.0
            if t is aten.ones_like.default
            else env(args[1])
        )
        return b.const(float(v), _dtype_of(b, node, node)) if isinstance(v, (int, float)) else v
    if t is aten.scalar_tensor.default:
        return float(args[0])
    return None


def _functional(op):
    """The out-of-place overload of in-place aten op `op` (add_.Tensor -> add.Tensor), or None:
    the tracer follows the write itself (_tracer.py), so only the value is converted."""
    if not isinstance(op, torch._ops.OpOverload):
        return None
    name = op._schema.name.split("::")[-1]
    if not name.endswith("_"):
        return None
    packet = getattr(aten, name[:-1], None)
    return getattr(packet, op._overloadname, None) if packet is not None else None


def _dtype_of(b, node, x) -> str:
    v = x.meta.get("val") if hasattr(x, "meta") else None
    if isinstance(v, torch.Tensor):
        if v.dtype not in _DTYPES:
            raise _unsupported(b, node, f"a {v.dtype} tensor (optfuse: f32, f64, f16, bf16, bool)")
        return _DTYPES[v.dtype]
    return "f32"


def convert_graph(graph, name: str, inputs: list, returned: list):
    """The optfuse graph JSON of traced fx graph `graph`, and what capture.py checks.

    `inputs`: (name, role) of each placeholder, in order (role param, grad, state, scalar or
    bool, a bool scalar);
    `returned`: the tensor argument each value of the graph's output list replaces."""
    b = _Builder(name)
    env: dict = {}
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    by_node = {}
    for n, (iname, role) in zip(placeholders, inputs):
        by_node[n] = iname
        if role in ("scalar", "bool"):
            b.scalars.append(iname if role == "scalar" else {"name": iname, "dtype": "bool"})
            b.dtype[iname] = "f32" if role == "scalar" else "bool"
            b.uniform[iname] = True
        else:
            b.inputs.append({"name": iname, "role": role})
            b.dtype[iname], b.uniform[iname] = "f32", False
        env[n] = iname

    def value(a):
        if isinstance(a, torch.fx.Node):
            return env[a]
        if isinstance(a, (bool, int, float)):
            return float(a)
        if isinstance(a, torch.dtype):
            return a
        if a is None:
            return None
        if isinstance(a, (list, tuple)):
            return type(a)(value(x) for x in a)
        return a

    writes: dict = {}
    for node in graph.nodes:
        if node.op in ("placeholder",):
            continue
        if node.op == "output":
            outs = node.args[0] if node.args else []
            outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
            for target, v in zip(returned, outs):
                _write(b, writes, target, env[v] if isinstance(v, torch.fx.Node) else v, node)
            continue
        if node.op != "call_function":
            raise _unsupported(b, node, f"an fx {node.op} node")
        t = node.target
        if t is WRITEBACK:
            _write(b, writes, by_node[node.args[0]], env[node.args[1]], node)
            continue
        r = _special(b, node, lambda a: env[a] if isinstance(a, torch.fx.Node) else value(a))
        if r is None:
            f = _OPS.get(t) or _OPS.get(_functional(t))
            if f is None:
                why = ""
                if getattr(t, "_schema", None) is not None and t._schema.is_mutable:
                    why = "an in-place op optfuse has no out-of-place form for"
                raise _unsupported(b, node, why)
            args = [value(a) for a in node.args]
            kw = {k: value(v) for k, v in node.kwargs.items()}
            try:
                r = f(b, *args, **kw)
            except TypeError as e:
                raise _unsupported(b, node, f"arguments {e}") from e
        env[node] = r
    for target, v in writes.items():
        role = dict(inputs)[target]
        if role in ("scalar", "bool"):
            raise CaptureError(
                f"rule {name!r} changes the scalar {target!r}: scalars are "
                "read-only (group options are changed in param_groups)"
            )
        if role == "grad":
            raise CaptureError(
                f"rule {name!r} writes its gradient {target!r}: the gradient "
                "is read-only (compute a new value instead of g.add_(...))"
            )
        if isinstance(v, (int, float)):
            v = b.const(v)
        if v == target:
            continue  # written back unchanged
        b.outputs[target] = b.cast(v, "f32")
    # Only the scalars the graph reads (one it ignores must not be a kernel argument).
    used = {a for nd in b.nodes for a in nd.get("args", []) if isinstance(a, str)}
    used |= {v for v in b.outputs.values() if isinstance(v, str)}
    b.scalars = [s for s in b.scalars if (s if isinstance(s, str) else s["name"]) in used]
    if not b.outputs:
        raise CaptureError(
            f"rule {name!r} changes nothing: update the param in place "
            "(p.add_(...)) or return its new value"
        )
    return b.to_json(), {"rows": b.rows}


def _write(b: _Builder, writes: dict, target: str, v, node) -> None:
    old = writes.get(target)
    if old is not None and old != v and old != target:
        raise CaptureError(
            f"rule {b.name!r} both changes {target!r} in place and returns a "
            "different value for it: do one or the other"
        )
    writes[target] = v
