"""A small builder for custom update rules: Python expressions become optfuse's JSON rule form
(``docs/graph-json.md``), which ``optfuse.torch.Custom`` fuses and caches like the built-ins.

    from optfuse.rule import Rule, sign

    r = Rule("my_lion", defaults={"lr": 1e-4, "betas": (0.9, 0.99), "weight_decay": 0.0})
    p, g, m = r.param("param"), r.grad("grad"), r.state("exp_avg")
    lr, b1, b2, wd = r.scalars("lr", "beta1", "beta2", "weight_decay")
    r.update(p, p - lr * wd * p - lr * sign(m * b1 + g * (1 - b1)))
    r.update(m, b2 * m + (1 - b2) * g)
    opt = optfuse.torch.Custom(model.parameters(), r, lr=3e-4)

Scalars are hyperparameters from ``defaults`` (a ``betas`` pair gives ``beta1``, ``beta2``) or
the built-ins ``step`` and ``bias_correction1``, ``bias_correction2`` (``1 - betaK^step``).
Scalar-only arithmetic such as ``1 - b1`` is moved to the host by optfuse (in double, rounded
once), so writing it in the rule costs nothing per element.
"""

from __future__ import annotations

import json
from typing import Union

Number = Union[int, float]


class Value:
    """A node of the rule's graph: an input, a scalar or an operation on them."""

    def __init__(self, rule: "Rule", id_: str):
        self._rule, self.id = rule, id_

    def _op(self, op: str, *args) -> "Value":
        return self._rule._node(op, self, *args)

    def __add__(self, o):
        return self._op("add", o)

    def __radd__(self, o):
        return self._rule._node("add", o, self)

    def __sub__(self, o):
        return self._op("sub", o)

    def __rsub__(self, o):
        return self._rule._node("sub", o, self)

    def __mul__(self, o):
        return self._op("mul", o)

    def __rmul__(self, o):
        return self._rule._node("mul", o, self)

    def __truediv__(self, o):
        return self._op("div", o)

    def __rtruediv__(self, o):
        return self._rule._node("div", o, self)

    def __pow__(self, o):
        return self._op("pow", o)

    def __neg__(self):
        return self._op("neg")

    def __abs__(self):
        return self._op("abs")

    def __lt__(self, o):
        return self._op("lt", o)

    def __le__(self, o):
        return self._op("le", o)

    def __gt__(self, o):
        return self._op("gt", o)

    def __ge__(self, o):
        return self._op("ge", o)

    def sign(self):
        return self._op("sign")

    def sqrt(self):
        return self._op("sqrt")

    def rsqrt(self):
        return self._op("rsqrt")

    def exp(self):
        return self._op("exp")

    def log(self):
        return self._op("log")


def _unary(op: str):
    def f(x: Value) -> Value:
        return x._op(op)

    f.__name__ = op
    return f


sign, sqrt, rsqrt, exp, log, is_finite = (
    _unary(o) for o in ("sign", "sqrt", "rsqrt", "exp", "log", "is_finite")
)
# Reductions: over the whole tensor, or per row (all dims but the first); see docs/graph-json.md.
reduce_sum, reduce_mean, reduce_max, reduce_min = (
    _unary(o) for o in ("reduce_sum", "reduce_mean", "reduce_max", "reduce_min")
)
row_sum, row_mean, row_max, row_min = (
    _unary(o) for o in ("row_sum", "row_mean", "row_max", "row_min")
)


def minimum(a: Value, b) -> Value:
    return a._op("min", b)


def maximum(a: Value, b) -> Value:
    return a._op("max", b)


def where(cond: Value, a, b) -> Value:
    return cond._op("select", a, b)


class Rule:
    """An update rule under construction; ``to_json()`` gives the form ``Custom`` takes."""

    def __init__(self, name: str, defaults: dict):
        self.name, self.defaults = name, dict(defaults)
        self._inputs, self._scalars, self._nodes, self._outputs = [], [], [], {}
        self._ids: set = set()

    def _new_id(self, hint: str) -> str:
        i = f"%{len(self._nodes)}" if not hint else hint
        if i in self._ids:
            raise ValueError(f"rule {self.name}: '{i}' is defined twice")
        self._ids.add(i)
        return i

    def _input(self, name: str, role: str) -> Value:
        self._inputs.append({"name": self._new_id(name), "role": role})
        return Value(self, name)

    def param(self, name: str = "param") -> Value:
        return self._input(name, "param")

    def grad(self, name: str = "grad") -> Value:
        return self._input(name, "grad")

    def state(self, name: str) -> Value:
        """A state tensor, ``optimizer.state[p][name]``, starting at zero."""
        return self._input(name, "state")

    def scalars(self, *names: str):
        values = []
        for n in names:
            self._scalars.append(self._new_id(n))
            values.append(Value(self, n))
        return values[0] if len(values) == 1 else values

    def _arg(self, a):
        if isinstance(a, Value):
            if a._rule is not self:
                raise ValueError(f"rule {self.name}: a value of another rule")
            return a.id
        if isinstance(a, (int, float)) and not isinstance(a, bool):
            return a
        raise TypeError(f"rule {self.name}: cannot use a {type(a).__name__} in a rule")

    def _node(self, op: str, *args) -> Value:
        i = self._new_id("")
        self._nodes.append({"id": i, "op": op, "args": [self._arg(a) for a in args]})
        return Value(self, i)

    def update(self, target: Value, value: Value) -> None:
        """Writes `value` to the param or state input `target` (in place, each step)."""
        if target.id in self._outputs:
            raise ValueError(f"rule {self.name}: '{target.id}' is updated twice")
        self._outputs[target.id] = self._arg(value)

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "defaults": self.defaults,
            "graph": {
                "name": self.name,
                "inputs": self._inputs,
                "scalars": self._scalars,
                "nodes": self._nodes,
                "outputs": self._outputs,
            },
        }

    def __str__(self) -> str:
        return json.dumps(self.to_json(), indent=1)
