"""optfuse: fused, JIT-compiled optimizer steps.

For PyTorch users, :mod:`optfuse.torch` has drop-in replacements for ``torch.optim`` classes::

    import optfuse.torch as oft
    opt = oft.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)

Each step runs one fused kernel pass per tensor, compiled once per update structure and kept in
an on-disk cache shared by processes (``$OPTFUSE_CACHE_DIR``, default ``~/.cache/optfuse``).
"""

import torch as _torch  # loads libtorch, which optfuse._core links (python/CMakeLists.txt)

from ._torch_build import TORCH_VERSION as _BUILT_FOR

if _torch.__version__.split("+")[0].split(".")[:2] != _BUILT_FOR.split("+")[0].split(".")[:2]:
    raise ImportError(
        f"optfuse was built against torch {_BUILT_FOR}, but this is torch {_torch.__version__}: "
        "reinstall optfuse for this torch (pip install --force-reinstall --no-deps "
        "--no-build-isolation optfuse, from its source)"
    )

from ._core import Error, version  # noqa: E402
from ._engine import engine, engine_options

__version__ = version()
__all__ = ["Error", "engine", "engine_options", "__version__"]
