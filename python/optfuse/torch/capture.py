"""Captured rules: an update rule written as a PyTorch function, traced into an optfuse graph.

    @optfuse.torch.rule
    def adamw(p, grad, exp_avg, exp_avg_sq, *, lr, betas, eps, weight_decay, step):
        beta1, beta2 = betas
        p.mul_(1 - lr * weight_decay)
        exp_avg.lerp_(grad, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        denom = (exp_avg_sq.sqrt() / (1 - beta2 ** step).sqrt()).add_(eps)
        p.addcdiv_(exp_avg, denom, value=-lr / (1 - beta1 ** step))

    opt = optfuse.torch.from_rule(adamw, model.parameters(),
                                  dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2))

The signature says what each argument is. Positional arguments are tensors: the param, its
gradient, then state tensors named as in ``optimizer.state[p]`` (annotate them ``Param``,
``Grad``, ``State`` to put them in another order). Keyword-only arguments are runtime scalars:
the param-group options (``betas`` arrives as a tuple of ``beta1``, ``beta2``, ...) and the
built-ins ``step`` and ``bias_correctionK`` (``1 - betaK ** step``, docs/graph-json.md). The
function changes tensors in place (``p.add_``, ``m.lerp_``, ``copy_``), or returns the new values
(a tensor for the param, a tuple in argument order, or a dict by name), or both.

Tracing (``_tracer.py``): the function runs once on small example tensors under a
``TorchDispatchMode`` that records every aten op it reaches, so the graph is torch's own
aten-level view of it, whatever mix of methods, operators and in-place forms it used; every
in-place write rebinds the argument it writes and becomes the output that replaces it. Scalars
are traced as 0-dim tensors, so they stay graph inputs and never become constants: changing
``lr`` or the step never retraces or recompiles. Arithmetic on scalars only
(``1 - beta2 ** step``, ``-lr / bc1``) is moved to the host by optfuse (computed in double,
rounded once). Anything that would turn a scalar into a Python number (``math.sqrt(bc)``,
``float(lr)``, ``if lr > 0:``) is an error at the line that did it: write it with torch ops
(``bc.sqrt()``, ``bc ** 0.5``, ``torch.where``).

The function is traced once, with 2-D example tensors (``EXAMPLE_SHAPE``): Python control flow
on shapes is fixed then, and a reduction over every dim but the first (``dim=-1`` or ``dim=1``
with ``keepdim=True``) is optfuse's per-row reduction (``row_mean`` ...), which on a tensor of
more than 2 dims covers all but its first dim; ``from_rule`` refuses such tensors for a rule
with row reductions rather than give them another meaning than eager torch would.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any, Callable, Optional

import torch

from . import _tracer
from ._aten import CaptureError, convert_graph

EXAMPLE_SHAPE = (4, 8)
# The scalars optfuse computes for every step itself (src/optim/custom.cpp, source_value).
_BUILTIN_SCALARS = ("step",)


class _Marker:
    def __init__(self, role: str):
        self.role = role

    def __repr__(self) -> str:
        return self.role.capitalize()


#: Annotations for a rule's tensor arguments (``def f(g: Grad, p: Param, m: State)``).
Param, Grad, State = _Marker("param"), _Marker("grad"), _Marker("state")


def _role(annotation) -> Optional[str]:
    if isinstance(annotation, _Marker):
        return annotation.role
    if isinstance(annotation, str):  # under `from __future__ import annotations`
        name = annotation.rsplit(".", 1)[-1]
        return name.lower() if name in ("Param", "Grad", "State") else None
    return None


class CapturedRule:
    """An update rule written as a PyTorch function (see the module's doc): calling it runs the
    function eagerly; ``to_json()`` gives the rule form ``optfuse.torch.Custom`` takes;
    ``explain()`` prints what optfuse makes of it."""

    def __init__(self, fn: Callable, name: Optional[str] = None, defaults: Optional[dict] = None):
        self.fn = fn
        self.name = name or fn.__name__
        self.defaults = dict(defaults or {})
        self.tensors, self.scalars = self._signature(fn)
        self._traced: dict = {}

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<optfuse captured rule {self.name!r}>"

    @property
    def param(self) -> str:
        return next(n for n, r in self.tensors if r == "param")

    @property
    def grad(self) -> str:
        return next(n for n, r in self.tensors if r == "grad")

    @property
    def state_names(self) -> list:
        return [n for n, r in self.tensors if r == "state"]

    def _signature(self, fn):
        where = f"rule {getattr(fn, '__qualname__', fn)!r}"
        tensors, scalars, unmarked = [], [], []
        for prm in inspect.signature(fn).parameters.values():
            if prm.kind in (prm.VAR_POSITIONAL, prm.VAR_KEYWORD):
                raise CaptureError(
                    f"{where}: *{prm.name} / **{prm.name}: name every tensor "
                    "and every scalar the rule takes"
                )
            if prm.kind == prm.KEYWORD_ONLY:
                scalars.append(prm.name)
                continue
            role = _role(prm.annotation)
            tensors.append([prm.name, role])
            if role is None:
                unmarked.append(tensors[-1])
        # Unannotated tensors: the param, then the gradient, then state (in that order).
        for want in ("param", "grad"):
            if unmarked and not any(r == want for _, r in tensors):
                unmarked.pop(0)[1] = want
        for t in unmarked:
            t[1] = "state"
        clash = [n for n, r in tensors if r == "state" and n in ("param", "grad")]
        if clash:
            raise CaptureError(
                f"{where}: a state tensor may not be named {clash[0]!r} (the "
                "graph's name for the param and the gradient)"
            )
        for want in ("param", "grad"):
            count = sum(r == want for _, r in tensors)
            if count != 1:
                raise CaptureError(
                    f"{where}: takes {count} {want} tensors; a rule takes one "
                    "param and one gradient (positional), then its state"
                )
        return [tuple(t) for t in tensors], scalars

    # ---- tracing ------------------------------------------------------------------------------
    def _scalar_names(self, defaults: dict) -> list:
        """(keyword, [graph scalar names]) for each keyword-only argument."""
        out = []
        for k in self.scalars:
            if k == "betas":
                n = len(defaults.get("betas", (0.9, 0.999)))
                out.append((k, [f"beta{i + 1}" for i in range(n)]))
            elif k in defaults or k in _BUILTIN_SCALARS or k.startswith("bias_correction"):
                out.append((k, [k]))
            else:
                raise CaptureError(
                    f"rule {self.name!r}: keyword argument {k!r} is neither an option in the "
                    f"defaults ({sorted(defaults)}) nor a built-in scalar (step, "
                    "bias_correctionK); a per-step value goes in host_scalars (explain() and "
                    "from_rule() take it)"
                )
        return out

    def trace(self, defaults: Optional[dict] = None):
        """The traced function: ``(fx.Graph of aten ops, optfuse graph JSON, info)`` for `defaults`
        (only the number of ``betas`` matters); traced once per such layout."""
        defaults = {**self.defaults, **(defaults or {})}
        layout = self._scalar_names(defaults)
        bools = frozenset(k for k, _ in layout if isinstance(defaults.get(k), bool))
        key = (tuple((k, len(v)) for k, v in layout), bools)
        hit = self._traced.get(key)
        if hit is None:
            hit = self._traced[key] = self._trace(layout, bools)
        return hit

    def _trace(self, layout, bools):
        names = [n for n, _ in self.tensors]
        returned = {}

        def call(args):
            tensors = dict(zip(names, args[: len(names)]))
            it = iter(args[len(names) :])
            kw = {}
            for k, ss in layout:
                vals = [next(it) for _ in ss]
                kw[k] = tuple(vals) if k == "betas" else vals[0]
            out = self.fn(*(tensors[n] for n in names), **kw)
            returned["layout"] = targets = self._returned(out)
            return [v for _, v in targets]

        examples = [torch.zeros(EXAMPLE_SHAPE) for _ in names]
        examples += [
            torch.tensor(False) if k in bools else torch.tensor(0.5) for k, ss in layout for _ in ss
        ]
        # The param and gradient are "param" and "grad" in the graph, as in the library's
        # (kernel keys include input names); state keeps its name: it is optimizer.state's.
        graph_name = {self.param: "param", self.grad: "grad"}
        inputs = [(graph_name.get(n, n), r) for n, r in self.tensors]
        inputs += [(sc, "bool" if k in bools else "scalar") for k, ss in layout for sc in ss]
        try:
            fx_graph, _ = _tracer.trace(self.fn, [n for n, _ in inputs], examples, call)
        except CaptureError:
            raise
        except Exception as e:  # noqa: BLE001  (torch raises many kinds; all are the user's)
            raise CaptureError(self._trace_failure(e)) from e
        graph, info = convert_graph(
            fx_graph,
            self.name,
            inputs,
            [graph_name.get(n, n) for n, _ in returned.get("layout", [])],
        )
        return fx_graph, graph, info

    def _returned(self, out) -> list:
        """What the function returned, as (tensor argument name, value) pairs."""
        names = [n for n, _ in self.tensors]
        if out is None:
            return []
        if isinstance(out, torch.Tensor):
            return [(self.param, out)]
        if isinstance(out, dict):
            bad = sorted(set(out) - set(names))
            if bad:
                raise CaptureError(
                    f"rule {self.name!r} returned {bad}, which are not among its "
                    f"tensor arguments {names}"
                )
            return [(k, v) for k, v in out.items() if v is not None]
        if isinstance(out, (tuple, list)):
            order = [self.param] + self.state_names
            if len(out) > len(order):
                raise CaptureError(
                    f"rule {self.name!r} returned {len(out)} values; a tuple "
                    f"gives new values of {order} in that order"
                )
            return [(k, v) for k, v in zip(order, out) if v is not None]
        raise CaptureError(
            f"rule {self.name!r} returned a {type(out).__name__}: return None "
            "(in-place updates), the new param, a tuple (param, *state) or a dict"
        )

    def _trace_failure(self, e: Exception) -> str:
        line = _user_line(e.__traceback__, self.fn)
        at = f" at {line}" if line else ""
        text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return (
            f"rule {self.name!r}{at}: running it on example tensors failed: "
            f"{type(e).__name__}: {text}"
        )

    # ---- what optfuse makes of it -------------------------------------------------------------
    def to_json(self, defaults: Optional[dict] = None) -> dict:
        """The rule in the form ``optfuse.torch.Custom`` takes (docs/graph-json.md)."""
        d = {**self.defaults, **(defaults or {})}
        _, graph, _ = self.trace(d)
        return {"name": self.name, "defaults": _plain(d), "graph": graph}

    def row_reductions(self, defaults: Optional[dict] = None) -> list:
        """The per-row reductions of the traced graph, as 'op at line' strings."""
        return self.trace(defaults)[2]["rows"]

    def explain(
        self,
        defaults: Optional[dict] = None,
        file=None,
        host_scalars: Optional[Callable[[dict, int], dict]] = None,
    ) -> dict:
        """Prints the traced aten graph, optfuse's graph, the idioms matched and host scalars,
        the canonical graph, the fusion clusters and each kernel's key (for the CPU engine);
        returns the same as a dict (``kernel_keys``: the keys in cluster order).
        ``host_scalars``: as ``from_rule`` takes it (its names are scalars of the rule)."""
        from .. import _core
        from .._engine import engine

        defaults = {**self.defaults, **(defaults or {})}
        if host_scalars is not None:
            defaults.update({k: float(v) for k, v in host_scalars(dict(defaults), 1).items()})
        fx_graph, graph, _ = self.trace(defaults)
        a = dict(_core.explain_graph(engine(), graph))
        a["traced"] = str(fx_graph)
        a["kernel_keys"] = [c["key"] for c in a["clusters"] if c["kind"] == "kernel"]
        out = file if file is not None else sys.stdout
        print(f"=== rule {self.name!r}: traced (aten ops) ===\n{a['traced']}", file=out)
        print(f"=== optfuse graph ===\n{a['source']}", file=out)
        print(f"=== normalized ===\n{a['text']}", file=out)
        for i, c in enumerate(c for c in a["clusters"] if c["kind"] == "kernel"):
            print(f"kernel {i} {c['name']!r} ({c['summary']}): key {c['key']}", file=out)
        return a


def rule(
    fn: Optional[Callable] = None, *, name: Optional[str] = None, defaults: Optional[dict] = None
):
    """Marks a PyTorch function as an optfuse update rule (module doc); as ``@rule`` or
    ``@rule(name=..., defaults=...)``. The function still runs eagerly when called."""
    if fn is None:
        return lambda f: CapturedRule(f, name=name, defaults=defaults)
    if isinstance(fn, CapturedRule):
        return fn
    return CapturedRule(fn, name=name, defaults=defaults)


def _plain(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return v.item()
    if isinstance(v, (tuple, list)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v


def _user_line(tb, fn: Callable) -> str:
    """'file:line: source' of the last frame of `fn` in traceback `tb`, or ''."""
    code = getattr(fn, "__code__", None)
    found = ""
    for frame, lineno in _walk(tb):
        if code is not None and frame.f_code is code:
            import linecache

            src = linecache.getline(frame.f_code.co_filename, lineno).strip()
            found = f"{frame.f_code.co_filename}:{lineno}: {src}"
    return found


def _walk(tb):
    while tb is not None:
        yield tb.tb_frame, tb.tb_lineno
        tb = tb.tb_next
