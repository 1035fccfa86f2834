"""Untrusted native kernels called across a process boundary: the client end of the kernel server.

`RemoteLibrary(backend, source)` behaves like the backend's own library (`kernel_names`,
`lib.<kernel>(*args, **launch)`), with the same argument checks and messages (the backend's own
binders run here, on the caller's tensors), but the kernel runs in the kernel server
(kernel_server_main.py): one sandboxed process per user process, started on first use, stopped at
exit and when this process dies. Per call, the tensor arguments are copied into a shared-memory arena
(reused; grown when a call needs more), one frame of offsets and scalars goes out, one status comes
back, and only what the kernel may write (non-const pointer parameters) is copied back into the
caller's tensors. Arguments that overlap in memory share one region of the arena, as they share
memory here. Calls are serialized (one server, one arena).

No memory the server lends outlives a call unchecked. The arena's file holds the pages of the calls it
serves (grown to a call's pages; cut once recent calls needed at most half of it); its mapping is
larger, and past the file's end it traps (SIGBUS), so a kernel that reaches past its arguments at an
offset finds no memory there. Every byte of the file outside the call's regions is zero when the call
starts (what the previous call's regions left is cleared when the layout changes) and is checked to be
zero still when it returns: a kernel that wrote there (state kept for its next call, or a message to
another kernel) has its server stopped, and its call fails. Memory of the server's own (its stack,
its heap) is out of this file's reach: see docs/security.md.

A server that crashes or outlives the call's time limit is stopped and the call raises
KernelServerError; the next call of any library starts a fresh server and loads its kernels there.
"""
from __future__ import annotations

import atexit
import ctypes
import functools
import json
import mmap
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple

import numpy as np
import torch

from ..backends.base import Backend, BoundKernels
from ..backends.cpu.backend import _bind
from ..backends.cpu.signature import parse_extern_c
from ..backends.mps_emu import msl_sites
from ..backends.mps_emu.backend import EmuKernel, SiteTable
from ..backends.mps_emu.msl_signature import MslKernel
from ..backends.protected import msl_param_written
from ..core import config
from ..core.errors import CompileError, MetalAccelError
from ..core.redact import redact
from ..sandbox import confine
from .kernel_protocol import (
    HEAD,
    KERNEL_ERROR,
    OK,
    OP_ARENA,
    OP_CALL,
    OP_LOAD,
    call_frame,
    cpu_call_format,
    emu_call_format,
)

START_TIMEOUT_S = 120.0   # interpreter + torch import + confinement, on a busy machine
LOAD_TIMEOUT_S = 120.0
MIN_CALL_LIMIT_S = 30.0   # a call may take this long, or 100x the slowest call of its library so far
SLOW_FACTOR = 100.0
MAX_REPLY = 1 << 20
ALIGN = 64                # a region keeps its address modulo this: aligned tensors stay aligned
MAPPING_MIN = 16 << 20   # the arena's mapping (address space only): past the file's end, a write traps
SHRINK_WINDOW = 32        # calls after which an arena file more than twice their largest need is cut
_ZEROS = tuple(bytes(n) for n in range(ALIGN))  # a gap between regions is shorter than ALIGN


class KernelServerError(MetalAccelError):
    """The kernel server could not start, load a kernel, or finish a call; the message says which."""


def _signal_name(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


@functools.lru_cache(maxsize=64)
def _zero_bytes(n: int) -> bytes:
    return bytes(n)


def _pages(size: int) -> int:
    """SIZE rounded up to whole pages, at least one."""
    return max(mmap.PAGESIZE, -(-size // mmap.PAGESIZE) * mmap.PAGESIZE)


def _anonymous_fd(size: int, scratch: str) -> int:
    """A file descriptor of SIZE bytes of shared memory, named nowhere."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("metal-accel-arena", os.MFD_CLOEXEC)
    else:
        fd, name = tempfile.mkstemp(dir=scratch, prefix="arena-")
        os.unlink(name)
    os.ftruncate(fd, size)
    return fd


class _Process:
    """One running kernel server: its process, socket, scratch directory and arena."""

    def __init__(self, build_dir: str) -> None:
        self.build_dir, self.pid = build_dir, os.getpid()
        self.scratch = tempfile.mkdtemp(prefix="metal-accel-kernels-")
        env = {**confine.scrubbed_environment(Path(self.scratch)), "METAL_ACCEL_BUILD_DIR": build_dir,
               "METAL_ACCEL_USER_CACHE": os.path.join(self.scratch, "user-cache"), "METAL_ACCEL_DISABLE": "1",
               "OMP_NUM_THREADS": str(torch.get_num_threads())}  # as many threads as the kernel gets in-process
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.fd_sock, their_fds = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)  # arena descriptors
        self.head = bytearray(HEAD.size)
        self.stderr = tempfile.TemporaryFile()  # why a start failed, for the reason
        self.proc = subprocess.Popen(
            [sys.executable, confine.__file__, "-m", "metal_accel.runtime.kernel_server_main", str(theirs.fileno()),
             str(their_fds.fileno()), str(self.pid), self.scratch], pass_fds=(theirs.fileno(), their_fds.fileno()),
            env=env, cwd=self.scratch, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.stderr)
        theirs.close()
        their_fds.close()
        self.arena: mmap.mmap | None = None
        self.arena_view: Any = None
        self.arena_bytes: np.ndarray | None = None
        self.arena_fd = -1
        self.base = self.capacity = 0  # the mapping, here and in the server
        self.size = 0                  # the arena's file: what a kernel can reach (past it, the mapping traps)
        self.filled: tuple[tuple[int, int], ...] = ()  # (offset, bytes) the last call filled: all else is zero
        self._server_mapped = False
        self._window_calls = self._window_need = 0
        self.timeout: float | None = None
        self.closed = False
        self._stderr_text = ""
        try:
            _, payload = self.receive(START_TIMEOUT_S, "starting")
            self.layers: list[str] = [str(x) for x in json.loads(payload).get("layers", [])]
        except (KernelServerError, ValueError, AttributeError) as exc:
            lines = self._stderr_lines()
            self.close()
            said = f" (it said: {redact(lines[-1][:300])})" if lines else ""
            raise KernelServerError(f"the kernel server did not start: {exc}{said}") from None
        if not confine.sufficient(self.layers) and not config.current().unconfined:
            self.close()
            missing = "; ".join(x for x in self.layers if "not applied" in x) or "no layer applied"
            raise KernelServerError(
                "refused to run untrusted native kernels: the kernel server could confine neither files nor system "
                f"calls on this machine ({missing}); set {confine.UNCONFINED_ENV}=1 to run them unconfined anyway, "
                "or METAL_ACCEL_TRUST_NATIVE=1 to run them in this process")

    def alive(self) -> bool:
        return self.proc.poll() is None and os.getpid() == self.pid

    def close(self) -> None:
        """Stop the process and unmap the arena; this object is dead afterwards (a new one replaces it)."""
        self.closed = True
        self.base = self.capacity = self.size = 0
        if os.getpid() == self.pid and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.sock.close()
        self.fd_sock.close()
        self._drop_arena()
        if not self.stderr.closed:
            self._stderr_text = self._read_stderr()
            self.stderr.close()
        if os.getpid() == self.pid:  # a forked child leaves its parent's server alone
            shutil.rmtree(self.scratch, ignore_errors=True)

    def send(self, op: int, lib: int, kernel: int, payload: bytes = b"") -> None:
        self.sock.sendall(HEAD.pack(len(payload), op, lib, kernel) + payload)

    def receive(self, limit: float, what: str) -> tuple[int, bytes]:
        """The server's reply: (status, payload); KernelServerError if it died or outlived LIMIT."""
        if self.timeout != limit:
            self.sock.settimeout(limit)
            self.timeout = limit
        try:
            got = self.sock.recv_into(self.head)
            while got < HEAD.size:
                more = self.sock.recv_into(memoryview(self.head)[got:]) if got else 0
                if not more:
                    raise ConnectionResetError
                got += more
            size, status, _, _ = HEAD.unpack(self.head)
            if size > MAX_REPLY:
                raise ConnectionResetError  # not a reply this protocol sends: a broken or hostile server
            payload = b""
            while len(payload) < size:
                chunk = self.sock.recv(size - len(payload))
                if not chunk:
                    raise ConnectionResetError
                payload += chunk
            return status, payload
        except socket.timeout:
            self.close()
            raise KernelServerError(f"{what} did not finish within {limit:.0f} s in the kernel server (a hang or an "
                                    "endless loop); the server was stopped") from None
        except OSError:
            try:
                code = self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                code = None
            self.close()
            raise KernelServerError(f"{what} crashed the kernel server ({_signal_name(code)}); it ran in a process of "
                                    "its own, so this one is unharmed") from None

    def _read_stderr(self) -> str:
        self.stderr.seek(0)
        return self.stderr.read().decode(errors="replace").strip()

    def _stderr_lines(self) -> list[str]:
        """What the server wrote to stderr (kept when it is closed)."""
        return (self._stderr_text if self.stderr.closed else self._read_stderr()).splitlines()

    def reserve(self, size: int) -> int:
        """The arena's base address, the arena first made to reach at least SIZE bytes: its file grown to SIZE's
        pages (new pages are zero), or a larger mapping made when SIZE does not fit in it."""
        need = _pages(size)
        if need > self.capacity:
            self._map(max(MAPPING_MIN, 2 * need))
        elif need > self.size:
            self._resize(need)
        return self.base

    def _map(self, capacity: int) -> None:
        """A fresh arena (zero) of CAPACITY bytes, here and in the server, in place of the current one. Its file
        holds all of it until the server has mapped it (settle() then cuts it to what calls need)."""
        fd = _anonymous_fd(capacity, self.scratch)
        try:
            arena = mmap.mmap(fd, capacity)
            socket.send_fds(self.fd_sock, [b"a"], [fd])
            self.send(OP_ARENA, 0, 0, capacity.to_bytes(8, "little"))
        except BaseException:
            os.close(fd)
            raise
        self._drop_arena()
        self.arena, self.arena_fd, self.capacity, self.size, self.filled = arena, fd, capacity, capacity, ()
        self.arena_view = ctypes.c_char.from_buffer(arena)
        self.arena_bytes = np.frombuffer(arena, dtype=np.uint8)
        self.base = ctypes.addressof(self.arena_view)
        self._server_mapped = False
        self._window_calls = self._window_need = 0

    def _drop_arena(self) -> None:
        self.arena_view = self.arena_bytes = None
        if self.arena is not None:
            self.arena.close()
            self.arena = None
        if self.arena_fd >= 0:
            os.close(self.arena_fd)
            self.arena_fd = -1

    def _resize(self, size: int) -> None:
        """The arena's file cut or grown to SIZE bytes: past them the mapping traps (SIGBUS), here and in the
        server; pages cut are gone, pages grown are zero. Never touch the arena past self.size."""
        os.ftruncate(self.arena_fd, size)
        self.size = size
        self.filled = tuple((off, min(n, size - off)) for off, n in self.filled if off < size)

    def fill(self, plan: Plan) -> None:
        """Copy PLAN's regions into the arena, after zeroing what the last call's regions left outside them."""
        if self.filled != plan.spans:
            for off, size in self.filled:
                ctypes.memset(self.base + off, 0, size)
            self.filled = plan.spans
        for address, size, off in plan.regions:
            ctypes.memmove(self.base + off, address, size)

    def settle(self, plan: Plan) -> None:
        """After a call's reply: cut the arena's file to the pages of the calls it serves (what the kernel wrote
        past them is gone). The first time, the server has mapped it now (it answered a later frame); later,
        once SHRINK_WINDOW calls needed at most half of it."""
        need = _pages(plan.need)
        self._window_calls += 1
        self._window_need = max(self._window_need, need)
        if not self._server_mapped:
            self._server_mapped = True
            self._resize(need)
        elif self._window_calls >= SHRINK_WINDOW:
            if 2 * self._window_need <= self.size:
                self._resize(self._window_need)
            self._window_calls = self._window_need = 0

    def untouched(self, plan: Plan) -> bool:
        """Whether every byte the kernel can reach outside PLAN's regions (the gaps between them, the tail up to
        the file's end) is still zero."""
        arena, tail = self.arena, self.arena_bytes
        assert arena is not None and tail is not None
        for start, end in plan.gaps:
            if arena[start:end] != _ZEROS[end - start]:
                return False
        if self.size - plan.need <= mmap.PAGESIZE:  # the common case: the file fits the call
            return arena[plan.need:self.size] == _zero_bytes(self.size - plan.need)
        return not np.count_nonzero(tail[plan.need:self.size])


_lock = threading.RLock()
_server: _Process | None = None
_generation = 0  # bumped whenever a server starts: libraries load their kernels again


def _current(build_dir: str) -> _Process:
    global _server, _generation
    if _server is not None and (_server.closed or not _server.alive() or _server.build_dir != build_dir):
        if os.getpid() == _server.pid:
            _server.close()
        _server = None
    if _server is None:
        _server = _Process(build_dir)
        _generation += 1
    return _server


def stop_server() -> None:
    """Stop this process's kernel server (the next remote call starts a new one)."""
    global _server
    with _lock:
        if _server is not None:
            _server.close()
            _server = None


def server_process() -> subprocess.Popen[bytes] | None:
    """The running server's process (tests use it), or None."""
    return _server.proc if _server is not None and _server.alive() else None


atexit.register(stop_server)


Buffer = tuple[int, int, bool]  # address, bytes, whether the kernel may write it (copied back)


class Plan(NamedTuple):
    """Where a call's buffers go in the arena."""

    regions: list[tuple[int, int, int]]     # (address, bytes, arena offset), overlapping buffers covered once
    offsets: list[int]                      # each buffer's arena offset
    need: int                               # the bytes the call fills: the regions end there
    writes: list[tuple[int, int, int]]      # (address, arena offset, bytes) copied back: the writable buffers
    spans: tuple[tuple[int, int], ...]      # (arena offset, bytes) of the regions
    gaps: tuple[tuple[int, int], ...]       # [start, end) between the regions (alignment): zero before and after


_plans: dict[tuple[Buffer, ...], Plan] = {}  # the same tensors come back call after call: their layout is kept


def _layout(buffers: tuple[Buffer, ...]) -> Plan:
    """Where BUFFERS go in the arena. A region keeps its address modulo ALIGN."""
    order = sorted(range(len(buffers)), key=lambda i: buffers[i][0])
    groups: list[list[Any]] = []  # [start, end, member indices]
    for i in order:
        address, size, _ = buffers[i]
        if groups and address < groups[-1][1]:
            groups[-1][1] = max(groups[-1][1], address + size)
            groups[-1][2].append(i)
        else:
            groups.append([address, address + size, [i]])
    offsets = [0] * len(buffers)
    regions, gaps, pos = [], [], 0
    for start, end, members in groups:
        skew = start % ALIGN
        off = -(-(pos - skew) // ALIGN) * ALIGN + skew
        if end > start:
            regions.append((start, end - start, off))
            if off > pos:
                gaps.append((pos, off))
            pos = off + end - start
        for i in members:
            offsets[i] = off + buffers[i][0] - start
    writes = [(address, offsets[i], size) for i, (address, size, writable) in enumerate(buffers) if writable and size]
    return Plan(regions, offsets, pos, writes, tuple((off, size) for _, size, off in regions), tuple(gaps))


class RemoteLibrary(BoundKernels):
    """A native kernel library whose kernels run in the kernel server; `lib.<kernel>(*args, **launch)`."""

    _ids = 0

    def __init__(self, backend: Backend, source: str) -> None:
        with _lock:
            RemoteLibrary._ids += 1
            self._id = RemoteLibrary._ids
        self._backend, self._source = backend.name, source
        artifact = backend.build(source)
        self._build_dir = str(config.build_dir())
        self._generation = -1
        self._slowest = 0.0
        self.time_limit_s: float | None = None  # None: MIN_CALL_LIMIT_S or 100x the slowest call so far
        with _lock:
            names, emu = self._attach_new()
        kernels: dict[str, Callable[..., None]] = {}
        if backend.name == "mps-emu":  # error messages name source lines from the artifact's access sites
            sites = SiteTable(msl_sites.load(Path(artifact).with_suffix(".sites.json")) or {})
            for index, d in enumerate(emu):
                kernels[d["name"]] = _RemoteEmuKernel(MslKernel.from_dict(d), self, index, sites)
        else:
            signatures = parse_extern_c(source)
            if sorted(signatures) != sorted(names):
                raise KernelServerError(f"the kernel server loaded kernels {names}, the source declares {list(signatures)}")
            for index, name in enumerate(names):
                kernels[name] = self._cpu_kernel(name, index, signatures[name])
        self.kernel_names = tuple(kernels)
        self._install_kernels(kernels)

    def __repr__(self) -> str:
        return f"RemoteLibrary({self._backend}, kernels={self.kernel_names})"

    # ------------------------------------------------------------ loading

    def _attach_new(self) -> tuple[list[str], list[dict[str, Any]]]:
        """Load this library in the current server (started if need be); its kernel names and emu descriptions."""
        server = _current(self._build_dir)
        server.send(OP_LOAD, self._id, 0, json.dumps({"backend": self._backend, "source": self._source}).encode())
        status, payload = server.receive(LOAD_TIMEOUT_S, "loading the kernel")
        if status != OK:
            raise CompileError(f"the kernel server cannot load the kernel: {payload.decode(errors='replace')}")
        try:
            reply = json.loads(payload)
            names, emu = [str(n) for n in reply["kernels"]], list(reply.get("emu", []))
        except (ValueError, KeyError, TypeError):
            raise KernelServerError("the kernel server sent an unreadable reply to a load") from None
        self._generation = _generation
        return names, emu

    def _server(self) -> _Process:
        server = _server
        if server is None or server.closed or self._generation != _generation or server.pid != os.getpid():
            self._attach_new()
            server = _server
            assert server is not None
        return server

    # ------------------------------------------------------------ calling

    def _run(self, name: str, buffers: tuple[Buffer, ...], frame: Callable[[list[int]], bytes]) -> str:
        """One call on BUFFERS, FRAME(arena offsets) being its request; '' or the error the kernel reported.
        The caller holds _lock."""
        plan = _plans.get(buffers)
        if plan is None:
            if len(_plans) > 256:
                _plans.clear()
            plan = _plans[buffers] = _layout(buffers)
        for attempt in range(2):
            server = self._server()
            base = server.reserve(plan.need)
            server.fill(plan)
            try:
                server.sock.sendall(frame(plan.offsets))
                break
            except OSError:  # the server was already gone (not this kernel's doing): a fresh one, once
                if attempt:
                    raise KernelServerError(f"kernel {name}: the kernel server is not reachable") from None
                server.close()
        limit = self.time_limit_s or max(MIN_CALL_LIMIT_S, SLOW_FACTOR * self._slowest)
        t0 = time.perf_counter()
        status, payload = server.receive(limit, f"kernel {name}")
        elapsed = time.perf_counter() - t0
        if elapsed > self._slowest:
            self._slowest = elapsed
        server.settle(plan)
        if not server.untouched(plan):
            server.close()  # the arena goes with it: nothing the kernel left there reaches another call
            raise KernelServerError(f"kernel {name} wrote into the kernel server's arena outside its arguments "
                                    "(memory that would outlive the call); the server was stopped")
        if status == KERNEL_ERROR:
            return payload.decode(errors="replace")
        if status != OK:
            raise KernelServerError(f"kernel {name} failed in the kernel server: {payload.decode(errors='replace')}")
        for address, off, size in plan.writes:
            ctypes.memmove(address, base + off, size)
        return ""

    def _cpu_kernel(self, name: str, index: int, params: list[Any]) -> Callable[..., None]:
        """The kernel NAME bound by the CPU backend's own binder (its checks, its messages), sent to the server."""
        fmt = call_frame(cpu_call_format(params))
        pointers = [i for i, p in enumerate(params) if p.is_pointer]
        writable = [not params[i].is_const for i in pointers]
        head = (fmt.size - HEAD.size, OP_CALL, self._id, index)
        current: list[tuple[Any, ...]] = [()]

        def forward(*values: Any) -> None:  # the converted arguments: pointers are the tensors' addresses
            args = current[0]
            buffers = tuple([(values[i], args[i].nbytes, w) for i, w in zip(pointers, writable)])

            def frame(offsets: list[int]) -> bytes:
                out = list(values)
                for i, off in zip(pointers, offsets):
                    out[i] = off
                return fmt.pack(*head, *out)
            self._run(name, buffers, frame)

        launch = _bind(name, forward, params)

        def kernel(*args: Any, **launch_options: Any) -> None:
            with _lock:
                current[0] = args
                try:
                    launch(*args, **launch_options)
                finally:
                    current[0] = ()
        kernel.__name__, kernel.__doc__ = name, launch.__doc__
        return kernel


class _RemoteEmuKernel(EmuKernel):
    """An MSL emulator kernel checked and launched by EmuKernel's own code, run by the kernel server."""

    def __init__(self, k: MslKernel, library: RemoteLibrary, index: int, sites: SiteTable | None = None) -> None:
        def forward(ptrs: Any, dims: Any, err: Any, size: int, cfg: Any = None) -> int:
            return self._forward(ptrs, dims, err, size)
        super().__init__(k, forward, sites)
        self._library, self._index = library, index
        self._slot_writable = [msl_param_written(p) for p in self._slots]
        self._regions: dict[int, tuple[int, int]] = {}  # buffer index -> (bytes, flags word), this call
        self._format = call_frame(emu_call_format(self._nargs))
        self._args: tuple[Any, ...] = ()
        self._bufs: dict[int, Any] = {}

    def _may_write(self, i: int) -> bool:
        return self._slot_writable[i] or super()._may_write(i)  # what is copied back, too

    def _config(self, regions: list[tuple[int, int, int, bool, int, int]]) -> tuple[Any, Any]:
        cfg, arr = super()._config(regions)
        self._regions = {r.index: (r.size, int(r.flags) | int(r.gran) << 8 | int(r.esize) << 16)
                         for r in arr[:cfg.nregions]}
        return cfg, arr

    def _scalar(self, i: int, value: Any, cast: str | None) -> tuple[ctypes.Array, int, int]:
        bound = super()._scalar(i, value, cast)
        self._bufs[i] = bound[0]
        return bound

    def __call__(self, *args: Any, **launch: Any) -> None:
        with _lock:
            self._args, self._bufs = args, {}
            try:
                super().__call__(*args, **launch)
            finally:
                self._args, self._bufs = (), {}

    def _forward(self, ptrs: Any, dims: Any, err: Any, size: int) -> int:
        if self._ntg:  # the call format carries the grid only (compile_shader cannot size them either)
            err.value = b"[[threadgroup(n)]] kernel parameters are not supported by the kernel server"
            return 1
        buffers = []
        for i, a in enumerate(self._args):
            if isinstance(a, torch.Tensor):  # bound from its storage offset to the storage's end, as compile_shader does
                nbytes = a.untyped_storage().nbytes() - a.storage_offset() * a.element_size()
                buffers.append((ptrs[i] or 0, max(0, nbytes), self._slot_writable[i]))
            else:
                buf = self._bufs[i]
                buffers.append((ctypes.addressof(buf), ctypes.sizeof(buf), False))
        head = (self._format.size - HEAD.size, OP_CALL, self._library._id, self._index)
        grid = list(dims)
        sizes = [self._regions.get(i, (0, 0))[0] for i in range(self._nargs)]
        flags = [self._regions.get(i, (0, 0))[1] for i in range(self._nargs)]
        error = self._library._run(self._k.name, tuple(buffers),
                                   lambda offsets: self._format.pack(*head, *offsets, *sizes, *flags, *grid))
        if error:
            err.value = error.encode()[:size - 1]
            return 1
        return 0
