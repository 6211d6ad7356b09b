"""optfuse: fused, JIT-compiled optimizer steps.

For PyTorch users, :mod:`optfuse.torch` has drop-in replacements for ``torch.optim`` classes::

    import optfuse.torch as oft
    opt = oft.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)

Each step runs one fused kernel pass per tensor, compiled once per update structure and kept in
an on-disk cache shared by processes (``$OPTFUSE_CACHE_DIR``, default ``~/.cache/optfuse``).
"""
from ._core import Error, version
from ._engine import engine, engine_options

__version__ = version()
__all__ = ["Error", "engine", "engine_options", "__version__"]
