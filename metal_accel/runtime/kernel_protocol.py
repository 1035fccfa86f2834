"""The kernel server's wire format, shared by its two ends (kernel_server.py, kernel_server_main.py).

Frames, both ways: HEAD (payload length, op or status, library, kernel) then the payload. A call carries
arena offsets and scalars packed with the struct formats below, never pickled.
"""
from __future__ import annotations

import struct
from typing import Any

HEAD = struct.Struct("<IBII")   # payload bytes, op (client) or status (server), library id, kernel index
OP_LOAD, OP_ARENA, OP_CALL = 1, 2, 3
OK, FAILED, KERNEL_ERROR = 0, 1, 2  # reply status: done; a load or call failed (text); the kernel reported an error
ERROR_BYTES = 2000                  # longest error text a reply carries

# C scalar type -> struct code the client packs it with
_SCALAR_CODES = {"float": "d", "double": "d", "bool": "?", "uint64_t": "Q", "size_t": "Q"}


def cpu_call_format(params: list[Any]) -> struct.Struct:
    """The payload of one call of a CPU kernel with PARAMS (cpu_signature.CParam): an arena offset (Q)
    per pointer, the value per scalar."""
    return struct.Struct("<" + "".join("Q" if p.is_pointer else _SCALAR_CODES.get(p.base_type, "q") for p in params))


def emu_call_format(nbuffers: int) -> struct.Struct:
    """The payload of one call of an mps-emu kernel: an arena offset per buffer index, the bytes the kernel may
    reach from it, a word of region flags (writable | granule << 8 | element bytes << 16), then the grid and
    group: the emulator's bounds and race checks see the buffers as the caller bound them."""
    return struct.Struct(f"<{nbuffers}Q{nbuffers}Q{nbuffers}Q6Q")


def call_frame(payload: struct.Struct) -> struct.Struct:
    """A whole call request: HEAD's fields, then PAYLOAD's."""
    return struct.Struct(HEAD.format + payload.format.lstrip("<"))
