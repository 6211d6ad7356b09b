"""optfuse for PyTorch: ``torch.optim`` optimizers whose step is one fused, JIT-compiled pass.

    import optfuse.torch as oft
    opt = oft.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)   # as torch.optim.AdamW
    for x, y in data:
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()

Each class subclasses its ``torch.optim`` namesake: the same constructor, defaults, validation,
``param_groups`` (schedulers work; changing ``lr`` never recompiles), ``state`` and
``state_dict()`` layout, so checkpoints move both ways between torch and optfuse. The tensors in
``optimizer.state[p]`` are the buffers the kernels update in place.

Update rules of your own, written as PyTorch functions: ``optfuse.torch.rule`` traces one into an
optfuse graph and ``optfuse.torch.from_rule`` makes the optimizer (``optfuse.torch.capture``).

Tensors: float32, float64, bfloat16 or float16 params (16-bit params get an f32 master copy,
``state[p]["master"]``, unless ``master_weights=False``), dtypes mixed in a group as torch allows,
in any layout torch's optimizers take (channels_last, strided views); DTensors under FSDP2.
Every param and gradient is checked in C++ at each step before any kernel runs.
"""

import torch as _torch  # noqa: F401  (loads torch's OpenMP runtime before share_openmp looks)

from .._engine import share_openmp as _share_openmp
from ._captured import CapturedOptimizer, from_rule
from ._fused import EXTRA_GROUP_OPTIONS, STEP_OPTIONS, FusedOptimizer
from .capture import CapturedRule, CaptureError, Grad, Param, State, rule
from .optimizers import (
    ASGD,
    LAMB,
    LARS,
    LBFGS,
    SGD,
    Adadelta,
    Adafactor,
    Adagrad,
    Adam,
    Adamax,
    AdamW,
    Custom,
    Lion,
    Muon,
    NAdam,
    RAdam,
    RMSprop,
    Rprop,
    SparseAdam,
)

# torch's CPU ops run on its OpenMP threads; optfuse's steps go there too (optfuse._engine).
_share_openmp()

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
    "FusedOptimizer",
    "STEP_OPTIONS",
    "EXTRA_GROUP_OPTIONS",
    "rule",
    "from_rule",
    "CapturedRule",
    "CapturedOptimizer",
    "CaptureError",
    "Param",
    "Grad",
    "State",
]
