"""8-bit optimizer state (``state_dtype="int8"``, docs/int8-state.md) in ``optimizer.state``.

A tensor's 8-bit state ``name`` is two tensors: ``uint8`` codes of the param's shape under the
state's own name, and one float32 scale per block under ``name + ".absmax"``. The maps are the
C++ library's (``_core.encode_8bit_state`` / ``decode_8bit_state``), so what this module converts
is what the kernels read. Conversions are computed aside and returned, never applied here: the
binding installs them only when every tensor of the group converted (a failure changes nothing).
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from .. import _core

# The group options that decide which tensors have 8-bit state and its blocks.
BLOCKING_KEYS = ("state_dtype", "block_size", "min_8bit_size")
# block_size's default (blocking_defaults() in src/optim/block_state.cpp), for groups that leave
# it out.
DEFAULT_BLOCK = 256
SCALES = ".absmax"


def blocks(n: int, block: int) -> int:
    return (n + block - 1) // block


def encode(name: str, values: torch.Tensor, block: int):
    """8-bit state `name` of `values`: (u8 codes shaped like them, f32 scales per block)."""
    v = values.detach().to(device="cpu", dtype=torch.float32).contiguous()
    n = v.numel()
    codes = torch.empty(v.shape, dtype=torch.uint8)
    scales = torch.empty((blocks(n, block),), dtype=torch.float32)
    _core.encode_8bit_state(name, block, v.data_ptr(), n, codes.data_ptr(), scales.data_ptr())
    return codes, scales


def decode(name: str, codes: torch.Tensor, scales, block: int, who: str) -> torch.Tensor:
    """The f32 values of 8-bit state `name`; ValueError naming `who` if the scales do not fit."""
    n = codes.numel()
    if not isinstance(scales, torch.Tensor):
        raise ValueError(f"{who}: 8-bit state '{name}' has no scales ('{name}{SCALES}')")
    if scales.dtype != torch.float32 or scales.numel() != blocks(n, block):
        raise ValueError(
            f"{who}: state '{name}{SCALES}' has {scales.numel()} {scales.dtype} "
            f"values, the codes of block_size {block} need {blocks(n, block)} "
            "float32 ones"
        )
    c, s = codes.contiguous(), scales.contiguous()
    values = torch.empty(codes.shape, dtype=torch.float32)
    _core.decode_8bit_state(name, block, c.data_ptr(), s.data_ptr(), n, values.data_ptr())
    return values


def conversions(
    st: dict,
    spec,
    old_block: int,
    block: int,
    who: str,
    initial: Callable[[str], Optional[torch.Tensor]],
):
    """What `st` (one param's ``optimizer.state``) must become for the buffers `spec` names:
    ({name: new tensor, or None to drop it}, the names among them that are new state). Float state
    to be 8-bit is encoded, 8-bit state to be float is decoded (its scales dropped), 8-bit state at
    another block size re-encoded, and new 8-bit state whose initial values `initial(name)` gives (a
    rule's state_init) encoded; state the step does not read follows a block size change, decoded.
    Raises before anything changes.
    """
    want = {s[0]: s[1] for s in spec}
    out, new = {}, set()
    for name, t in st.items():
        if not isinstance(t, torch.Tensor) or name.endswith(SCALES):
            continue
        held_8bit = t.dtype == torch.uint8
        if want.get(name) == "u8":
            if held_8bit and old_block == block:
                decode(name, t, st.get(name + SCALES), block, who)  # checks the scales
                continue
            values = decode(name, t, st.get(name + SCALES), old_block, who) if held_8bit else t
            out[name], out[name + SCALES] = encode(name, values, block)
        elif held_8bit and (name in want or old_block != block):
            out[name] = decode(name, t, st.get(name + SCALES), old_block, who)
            out[name + SCALES] = None
    for name, dtype in want.items():
        if dtype == "u8" and name not in st:
            values = initial(name)
            if values is not None:
                out[name], out[name + SCALES] = encode(name, values, block)
                new.update((name, name + SCALES))
    return out, new
