"""The process-wide engines: one per target, made at first use, shared by every optimizer.
The library's warnings (an unusable cache directory, a corrupt entry recompiled) arrive as
Python ``RuntimeWarning``s.

An engine owns the compiled kernels (in memory and in the disk cache), so sharing it means a
kernel is compiled or loaded once per process whatever the number of optimizers.
Environment (read when an engine is first made):

``OPTFUSE_CACHE_DIR``  the disk cache (default: ``optfuse._core.default_cache_dir()``,
                       ``$XDG_CACHE_HOME/optfuse`` or ``~/.cache/optfuse``); ``""`` = memory only
``OPTFUSE_THREADS``    worker threads for kernels (default: all cores)
``OPTFUSE_TARGET``     the CPU target (default ``host``; any Halide target string)
``OPTFUSE_SCHEDULES``  tuned schedules, a database file or a directory of them, ``none`` for
                       default schedules (default: what ``optfuse tune`` wrote to
                       ``~/.local/share/optfuse/schedules``, else the databases shipped with the
                       package; include/optfuse/schedules.h)
``OPTFUSE_OPENMP``     ``0``: optfuse's parallel loops on its own threads even where torch's
                       OpenMP runtime is loaded (default: on torch's; see share_openmp)
"""

from __future__ import annotations

import os
import threading

from . import _core

_lock = threading.Lock()
_engines: dict[str, _core.Engine] = {}


def engine_options() -> dict:
    """The options the CPU engine is (or will be) made with, from the environment."""
    cache_dir = os.environ.get("OPTFUSE_CACHE_DIR", _core.default_cache_dir())
    return {
        "target": os.environ.get("OPTFUSE_TARGET", "host"),
        "threads": int(os.environ.get("OPTFUSE_THREADS", "0")),
        "cache_dir": cache_dir,
        "memory_only": cache_dir == "",
        # "" = the C++ rule: $OPTFUSE_SCHEDULES, the per-user directory, the shipped databases.
        "schedule_db": "",
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


def share_openmp(library_hint: str = "libgomp") -> bool:
    """Runs optfuse's parallel loops on the GNU OpenMP runtime already loaded in this process
    (torch's): its threads keep spinning after every torch op, and on few cores optfuse's own
    threads would wait for them (``include/optfuse/parallel.h``). Returns whether it is in use;
    ``OPTFUSE_OPENMP=0``, or no libgomp loaded, leaves optfuse's own threads."""
    import ctypes

    if os.environ.get("OPTFUSE_OPENMP", "1") == "0":
        return False
    try:
        with open("/proc/self/maps", encoding="utf-8") as f:
            paths = {line.split()[-1] for line in f if library_hint in line and "/" in line}
    except OSError:
        return False
    # torch's own first (other libraries, e.g. scikit-learn, may bring a libgomp of their own).
    for path in sorted(paths, key=lambda q: ("/torch/" not in q, q)):
        try:
            lib = ctypes.CDLL(path)
            addr = [
                ctypes.cast(getattr(lib, n), ctypes.c_void_p).value
                for n in ("GOMP_parallel", "omp_get_thread_num", "omp_get_num_threads")
            ]
        except (OSError, AttributeError):
            continue
        _core.use_openmp_runtime(*addr)
        return True
    return False
