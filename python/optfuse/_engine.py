"""The process-wide engines: one per target, made at first use, shared by every optimizer.

An engine owns the compiled kernels (in memory and in the disk cache), so sharing it means a
kernel is compiled or loaded once per process whatever the number of optimizers.
Environment (read when an engine is first made):

``OPTFUSE_CACHE_DIR``  the disk cache (default: ``optfuse._core.default_cache_dir()``,
                       ``$XDG_CACHE_HOME/optfuse`` or ``~/.cache/optfuse``); ``""`` = memory only
``OPTFUSE_THREADS``    worker threads for kernels (default: all cores)
``OPTFUSE_TARGET``     the CPU target (default ``host``; any Halide target string)
``OPTFUSE_SCHEDULES``  tuned schedules, a database file or a directory of them (default: the
                       databases shipped with the package)
"""
from __future__ import annotations

import os
import threading
from pathlib import Path

from . import _core

_lock = threading.Lock()
_engines: dict[str, _core.Engine] = {}


def engine_options() -> dict:
    """The options the CPU engine is (or will be) made with, from the environment."""
    shipped = Path(__file__).with_name("schedules")
    return {
        "target": os.environ.get("OPTFUSE_TARGET", "host"),
        "threads": int(os.environ.get("OPTFUSE_THREADS", "0")),
        "cache_dir": os.environ.get("OPTFUSE_CACHE_DIR", _core.default_cache_dir()),
        "schedule_db": _core.default_schedule_db(str(shipped) if shipped.is_dir() else ""),
    }


def engine(cuda: bool = False) -> _core.Engine:
    """The shared engine for CPU tensors, or (``cuda=True``) for CUDA tensors."""
    key = "cuda" if cuda else "cpu"
    with _lock:
        e = _engines.get(key)
        if e is None:
            o = engine_options()
            if cuda:
                o["target"] = os.environ.get("OPTFUSE_CUDA_TARGET", "host-cuda")
            e = _engines[key] = _core.Engine(**o)
        return e
