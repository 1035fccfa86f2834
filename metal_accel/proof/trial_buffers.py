"""Buffers of a proof's trial calls: filled like stale memory, fenced by guard regions.

A kernel must not be able to tell a proof from production by the buffers it is handed. Production
(and the speed gate, which runs the production op) gives host code plain `torch.empty` memory:
whatever the allocator holds, zeros from fresh pages or a previous tensor's values. Proof calls
draw, per call, one of FILLS for every buffer host code allocates:

- "plain": the memory as allocated, exactly what production sees;
- "noise": random values of the dtype, as left by earlier activations (an unwritten element then
  differs from the reference, so it is caught);
- "leftover": the values of another tensor of the call (an input's or a parameter's), cycled, as a
  freed and reused buffer holds.

No fill is NaN or another value production never shows, so "my output looks poisoned" tells a kernel
nothing. The fills come from a shuffled deck (`next_fill`): every FILLS appears in any 2*len(FILLS)-1
consecutive calls, so a proof of six or more trials has calls of each kind, including plain ones,
whose outputs are checked like the others. The repeat call of the determinism check always uses a
fresh "noise" fill, so an element left unwritten shows as a difference between the two calls even
where the first call's fill happened to match the reference.

Every buffer host code allocates in a proof call, and every input of a trial, is the middle of a
larger allocation: GUARD_BYTES of random bytes before and after it. After each call the guards are
compared with what was written there; a changed byte is an out-of-bounds write. The tensor handed out
is made with DLPack from the middle, so its storage starts at its first element (`storage_offset()`
is 0, as in production) and keeps the whole allocation alive. What guards cannot hide: a kernel that
reads out of bounds could see random bytes where production has allocator metadata; only native
code that stays in bounds (or out-of-process production) removes that signal.
"""
from __future__ import annotations

import math
import secrets
import weakref
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import torch
from torch.utils import _pytree

FILLS = ("plain", "noise", "leftover")
GUARD_BYTES = 4096
NOISE_BLOCK = 1 << 16  # noise is drawn once per this many elements and tiled, at a random rotation

_deck: list[str] = []
_rng = secrets.SystemRandom()


def next_fill() -> str:
    """The fill of the next proof call: FILLS shuffled, dealt one at a time, reshuffled when empty."""
    if not _deck:
        _deck.extend(FILLS)
        _rng.shuffle(_deck)
    return _deck.pop()


@dataclass
class Guard:
    """One fenced allocation: BASE holds GUARD_BYTES of PATTERN, the tensor's bytes, GUARD_BYTES more."""

    base: torch.Tensor          # uint8
    nbytes: int
    itemsize: int
    pattern: torch.Tensor       # uint8, 2 * GUARD_BYTES

    def violation(self) -> str:
        """'' if both guards are intact; else how far out the farthest write went, e.g. '1 element after the end'."""
        head, tail = self.base[:GUARD_BYTES], self.base[GUARD_BYTES + self.nbytes:]
        p = self.pattern.to(self.base.device)
        if not torch.equal(head, p[:GUARD_BYTES]):
            first = int(torch.nonzero(head != p[:GUARD_BYTES])[0])
            n = math.ceil((GUARD_BYTES - first) / self.itemsize)
            return f"{n} element{'s' if n > 1 else ''} before the start"
        if not torch.equal(tail, p[GUARD_BYTES:]):
            last = int(torch.nonzero(tail != p[GUARD_BYTES:])[-1])
            n = last // self.itemsize + 1
            return f"{n} element{'s' if n > 1 else ''} after the end"
        return ""


_guards: dict[int, Guard] = {}  # id(tensor) -> its guard, while the tensor lives


def guard_of(t: torch.Tensor) -> Guard | None:
    return _guards.get(id(t))


def _storage_numel(shape: Sequence[int], stride: Sequence[int]) -> int:
    if any(s == 0 for s in shape):
        return 0
    return 1 + sum((size - 1) * st for size, st in zip(shape, stride))


def guarded_empty(shape: Sequence[int], stride: Sequence[int], dtype: torch.dtype,
                  device: torch.device | str, gen: torch.Generator | None = None) -> torch.Tensor:
    """An uninitialized tensor of SHAPE and STRIDE (storage offset 0) inside a fenced allocation; its guard
    is found with guard_of while it lives. Falls back to a plain empty_strided where DLPack cannot carry
    the dtype (no guard then)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    nbytes = _storage_numel(shape, stride) * itemsize
    if nbytes == 0 or any(st < 0 for st in stride):
        return torch.empty_strided(tuple(shape), tuple(stride), dtype=dtype, device=device)
    base = torch.empty(2 * GUARD_BYTES + nbytes, dtype=torch.uint8, device=device)
    pattern = torch.randint(0, 256, (2 * GUARD_BYTES,), generator=gen, dtype=torch.uint8)
    base[:GUARD_BYTES] = pattern[:GUARD_BYTES].to(base.device)
    base[GUARD_BYTES + nbytes:] = pattern[GUARD_BYTES:].to(base.device)
    try:
        flat = torch.from_dlpack(base[GUARD_BYTES:GUARD_BYTES + nbytes].view(dtype))
    except (RuntimeError, TypeError, BufferError):
        return torch.empty_strided(tuple(shape), tuple(stride), dtype=dtype, device=device)
    out = flat.as_strided(tuple(shape), tuple(stride))
    key = id(out)
    _guards[key] = Guard(base, nbytes, itemsize, pattern)
    weakref.finalize(out, _guards.pop, key, None)
    return out


def guarded_copy(t: torch.Tensor, gen: torch.Generator | None = None) -> torch.Tensor:
    """T's values (its whole storage span, gaps of a strided layout included) in a fenced allocation."""
    if not t.numel() or any(s < 0 for s in t.stride()):
        return t
    out = guarded_empty(t.shape, t.stride(), t.dtype, t.device, gen)
    if guard_of(out) is None:
        return t
    n = _storage_numel(t.shape, t.stride())
    out.as_strided((n,), (1,)).copy_(t.as_strided((n,), (1,), t.storage_offset()))
    return out


@dataclass
class CallBuffers:
    """What one proof call's allocations get: the fill, where leftover values come from, and the guards
    of every buffer made (checked by `violations`)."""

    fill: str
    sources: Sequence[torch.Tensor] = ()
    gen: torch.Generator = field(default_factory=lambda: torch.Generator().manual_seed(secrets.randbits(62)))
    made: list[tuple[int, torch.Tensor]] = field(default_factory=list)  # (id, weakref-free handle) in order

    def allocate(self, like: torch.Tensor) -> torch.Tensor:
        """A fenced tensor shaped like LIKE (shape, strides, dtype, device), filled by this call's fill."""
        out = guarded_empty(like.shape, like.stride(), like.dtype, like.device, self.gen)
        self.made.append((id(out), out))
        self.fill_buffer(out)
        return out

    def fill_buffer(self, t: torch.Tensor) -> None:
        n = _storage_numel(t.shape, t.stride())
        if not n or self.fill == "plain":
            return
        flat = t.as_strided((n,), (1,), t.storage_offset())
        src = self._source(n) if self.fill == "leftover" else None
        with torch.no_grad():
            flat.copy_(src if src is not None else _noise(n, t.dtype, self.gen).to(t.device))

    def _source(self, n: int) -> torch.Tensor | None:
        usable = [s for s in self.sources if s.numel() and not s.is_complex()]
        if not usable:
            return None
        s = usable[int(torch.randint(len(usable), (1,), generator=self.gen))].reshape(-1)
        reps = -(-n // s.numel())
        return (s.repeat(reps) if reps > 1 else s)[:n]

    def violations(self, outputs: Sequence[torch.Tensor]) -> str:
        """'' if no buffer this call allocated was written out of bounds; else a sentence naming the first."""
        names = {id(o): f"output {i}" for i, o in enumerate(outputs)}
        for key, t in self.made:
            g = guard_of(t)
            where = g.violation() if g is not None else ""
            if where:
                name = names.get(key, "a buffer the host code allocated")
                return f"wrote outside its output buffer ({where} of {name})"
        return ""


def _noise(n: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """N stale-looking values of DTYPE: normal floats, small integers, random bools; tiled from a block."""
    block = min(n, NOISE_BLOCK)
    if dtype == torch.bool:
        vals = torch.rand(block, generator=gen) < 0.5
    elif dtype.is_floating_point or dtype.is_complex:
        vals = torch.randn(block, generator=gen).to(dtype)
    else:
        info = torch.iinfo(dtype)
        vals = torch.randint(max(info.min, -1000), min(info.max, 1000) + 1, (block,), generator=gen).to(dtype)
    if block == n:
        return vals
    shift = int(torch.randint(block, (1,), generator=gen))
    return vals.roll(shift).repeat(-(-n // block))[:n]


_current: ContextVar[CallBuffers | None] = ContextVar("metal_accel_call_buffers", default=None)


@contextmanager
def proof_call(fill: str, sources: Sequence[torch.Tensor] = ()) -> Iterator[CallBuffers]:
    """While active, the proof allocators of sandbox.build_namespace give fenced buffers with FILL."""
    bufs = CallBuffers(fill, sources)
    token = _current.set(bufs)
    try:
        yield bufs
    finally:
        _current.reset(token)


def current() -> CallBuffers | None:
    return _current.get()


def proof_allocation(t: torch.Tensor) -> torch.Tensor:
    """What a proof allocator returns for the plainly allocated T: outside a proof call, T filled with
    noise (an unfenced allocation, still no NaN); inside one, a fenced tensor like T with the call's fill."""
    bufs = current()
    if bufs is None:
        bufs = CallBuffers("noise")
        bufs.fill_buffer(t)
        return t
    return bufs.allocate(t)


def proof_initialized(t: torch.Tensor) -> torch.Tensor:
    """As proof_allocation for a tensor whose values count (zeros, ones, full, arange): fenced, values kept."""
    bufs = current()
    if bufs is None or not t.numel():
        return t
    out = guarded_empty(t.shape, t.stride(), t.dtype, t.device, bufs.gen)
    if guard_of(out) is None:
        return t
    bufs.made.append((id(out), out))
    with torch.no_grad():
        out.copy_(t)
    return out


def input_copies(values: Sequence[Any], gen: torch.Generator | None = None) -> list[Any]:
    """VALUES with every tensor, inside tuples, lists and dicts too, replaced by a fenced copy (guarded_copy);
    other values as they are."""
    def one(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return guarded_copy(v, gen)
        if isinstance(v, (tuple, list, dict)) or type(v) in _pytree.SUPPORTED_NODES:
            return _pytree.tree_map(lambda t: guarded_copy(t, gen) if isinstance(t, torch.Tensor) else t, v)
        return v
    return [one(v) for v in values]


def input_violation(tensors: Sequence[torch.Tensor], what: str) -> str:
    """'' unless a fenced tensor among TENSORS was written out of bounds: 'wrote outside its input buffer
    (1 element after the end of input 0)'."""
    for i, t in enumerate(tensors):
        g = guard_of(t)
        where = g.violation() if g is not None else ""
        if where:
            return f"wrote outside its {what} buffer ({where} of {what} {i})"
    return ""
