"""The kernel server's own end: a sandboxed process that loads untrusted native kernels and runs their calls.

    python metal_accel/sandbox/confine.py -m metal_accel.runtime.kernel_server_main FD FD_CHANNEL PARENT_PID SCRATCH

It talks over the Unix socket FD (kernel_server.py is the other end; arenas' descriptors come over
FD_CHANNEL), dies with its parent
(PR_SET_PDEATHSIG), and confines itself (confine.py: scrubbed environment, no network, no exec, no
writes outside SCRATCH, the build directory read-only) before it loads any kernel. It only loads
artifacts the caller built and the binary check passed; it never compiles. Kernels see tensors in a
shared-memory arena the client fills; a call carries arena offsets and scalars, packed with the
struct formats below, never pickled.

Frames, both ways: HEAD (payload length, op or status, library, kernel) then the payload.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import signal
import socket
import struct
import sys
from pathlib import Path
from typing import Any, Callable

from ..backends import available_backends, get_backend
from ..backends.mps_emu.backend import LaunchConfig, LaunchRegion
from ..core import config
from ..proof.worker_main import prepare as prepare_backend
from ..sandbox import confine
from .kernel_protocol import (
    ERROR_BYTES,
    FAILED,
    HEAD,
    KERNEL_ERROR,
    OK,
    OP_ARENA,
    OP_CALL,
    OP_LOAD,
    cpu_call_format,
    emu_call_format,
)


def prepare() -> None:
    """What must happen before confinement, for every native backend here: imports, the compiler's identity
    and the toolchain baseline (they run the compiler, which the sandbox forbids)."""
    for name in available_backends():
        if name in ("cpu", "mps-emu"):
            prepare_backend(name, "cpu")


class _FpGuard:
    """The floating-point control state (rounding, flush-to-zero, exception masks; not the sticky flags):
    read after every call, restored and reported when a kernel changed it, so later kernels are unaffected."""

    def __init__(self) -> None:
        self._libm = ctypes.CDLL("libm.so.6" if sys.platform.startswith("linux") else ctypes.util.find_library("m"))
        self._saved = ctypes.create_string_buffer(64)
        self._now = ctypes.create_string_buffer(64)
        self._libm.fegetenv(self._saved)
        x86 = sys.platform.startswith("linux") and os.uname().machine == "x86_64"
        # glibc x86-64 fenv_t: x87 control word at 0, MXCSR at 28 (its low 6 bits are sticky flags);
        # aarch64 glibc and macOS: the control register first
        self._fields = [(ctypes.c_uint16.from_buffer(self._now, 0), 0xFFFF),
                        (ctypes.c_uint32.from_buffer(self._now, 28), ~0x3F)] if x86 else \
            [(ctypes.c_uint32.from_buffer(self._now, 0), 0xFFFFFFFF)]
        self._libm.fegetenv(self._now)
        self._control = [f.value & mask for f, mask in self._fields]

    def changed(self) -> bool:
        self._libm.fegetenv(self._now)
        if [f.value & mask for f, mask in self._fields] == self._control:
            return False
        self._libm.fesetenv(self._saved)
        return True


def _die_with_parent(parent_pid: int) -> None:
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent_pid:
        os._exit(0)  # the parent died before the signal was armed


class _Library:
    """One loaded library: per kernel, the function to call with the payload and the arena's base address."""

    def __init__(self, backend_name: str, source: str) -> None:
        lib = get_backend(backend_name).compile(source)  # loads the artifact the parent's side built
        self.names = list(lib.kernel_names)
        self.emu: list[dict[str, Any]] = []
        self.calls: list[Call] = []
        if backend_name == "mps-emu":
            for name in self.names:
                kernel = getattr(lib, name)
                self.emu.append(kernel._k.to_dict())
                self.calls.append(_emu_call(kernel._fn, kernel._nargs, kernel._sites))
        else:
            for name in self.names:
                self.calls.append(_cpu_call(getattr(lib._dll, name), lib.signatures[name]))  # argtypes set by _bind


Call = Callable[[bytearray, int, int], str]  # (receive buffer, payload offset, arena base) -> error or ''


def _cpu_call(fn: Any, params: list[Any]) -> Call:
    fmt = cpu_call_format(params)
    pointers = [i for i, p in enumerate(params) if p.is_pointer]

    def call(buf: bytearray, at: int, base: int) -> str:
        values = list(fmt.unpack_from(buf, at))
        for i in pointers:
            values[i] += base
        fn(*values)
        return ""
    return call


def _emu_call(fn: Any, nargs: int, sites: Any) -> Call:
    fmt = emu_call_format(nargs)
    ptrs = (ctypes.c_void_p * max(1, nargs))()
    dims = (ctypes.c_uint64 * 6)()
    err = ctypes.create_string_buffer(1024)
    regions = (LaunchRegion * max(1, nargs))()
    cfg = LaunchConfig(0, sites.n, ctypes.addressof(regions), ctypes.addressof(sites.pc), ctypes.addressof(sites.path))

    def call(buf: bytearray, at: int, base: int) -> str:
        values = fmt.unpack_from(buf, at)
        n = 0
        for i in range(nargs):
            ptrs[i] = base + values[i]
            size, flags = values[nargs + i], values[2 * nargs + i]
            if size:
                regions[n] = LaunchRegion(base + values[i], size, i, flags & 0xFF, (flags >> 8) & 0xFF, flags >> 16)
                n += 1
        cfg.nregions = n
        dims[:] = values[3 * nargs:]
        if fn(ptrs, dims, err, 1024, ctypes.byref(cfg)) != 0:
            return err.value.decode(errors="replace")
        return ""
    return call


class _Server:
    def __init__(self, sock: socket.socket, fd_sock: socket.socket, fp: _FpGuard) -> None:
        self.sock, self.fd_sock, self.fp = sock, fd_sock, fp
        self.libs: dict[int, _Library] = {}
        self.arena: Any = None
        self.base = 0

    def reply(self, status: int, lib: int = 0, payload: bytes = b"") -> None:
        self.sock.sendall(HEAD.pack(len(payload), status, lib, 0) + payload)

    def map_arena(self, size: int) -> None:
        import mmap
        _, fds, _, _ = socket.recv_fds(self.fd_sock, 16, 1)  # the client sent it before this frame
        arena = mmap.mmap(fds[0], size)
        os.close(fds[0])
        self.arena, self.base = arena, ctypes.addressof(ctypes.c_char.from_buffer(arena))

    def load(self, lib_id: int, payload: bytes) -> None:
        req = json.loads(payload)
        try:
            lib = self.libs[lib_id] = _Library(req["backend"], req["source"])
        except Exception as exc:
            self.reply(FAILED, lib_id, f"{type(exc).__name__}: {exc}"[:ERROR_BYTES].encode())
            return
        self.reply(OK, lib_id, json.dumps({"kernels": lib.names, "emu": lib.emu}).encode())

    def call(self, lib_id: int, kernel: int, buf: bytearray, at: int) -> None:
        try:
            error = self.libs[lib_id].calls[kernel](buf, at, self.base)
        except Exception as exc:
            self.reply(FAILED, lib_id, f"{type(exc).__name__}: {exc}"[:ERROR_BYTES].encode())
            return
        if self.fp.changed():
            self.reply(FAILED, lib_id, b"the kernel changed the floating-point control state (rounding mode, "
                                       b"flush-to-zero or exception masks); it is dropped")
        elif error:
            self.reply(KERNEL_ERROR, lib_id, error[:ERROR_BYTES].encode())
        else:
            self.sock.sendall(_DONE)

    def serve(self) -> None:
        buf = bytearray(1 << 16)
        have = 0
        while True:
            got = self.sock.recv_into(memoryview(buf)[have:])
            if not got:
                return  # the client closed the connection: done
            have += got
            pos = 0
            while have - pos >= HEAD.size:
                size, op, lib_id, kernel = HEAD.unpack_from(buf, pos)
                end = pos + HEAD.size + size
                if end > len(buf):  # a frame larger than the buffer (a long source): make room
                    buf[len(buf):] = bytes(end - len(buf))
                if end > have:
                    break
                if op == OP_CALL:
                    self.call(lib_id, kernel, buf, pos + HEAD.size)
                elif op == OP_ARENA:
                    self.map_arena(struct.unpack_from("<Q", buf, pos + HEAD.size)[0])
                elif op == OP_LOAD:
                    self.load(lib_id, bytes(buf[pos + HEAD.size:end]))
                pos = end
            if pos:
                buf[:have - pos] = buf[pos:have]
                have -= pos


_DONE = HEAD.pack(0, OK, 0, 0)


def serve(fd: int, fd_channel: int, parent_pid: int, scratch: str) -> None:
    """Prepare, confine (before any kernel loads), say hello with the layers applied, then serve calls."""
    _die_with_parent(parent_pid)
    sock, fd_sock = socket.socket(fileno=fd), socket.socket(fileno=fd_channel)
    prepare()
    fp = _FpGuard()
    netns = os.environ.pop("METAL_ACCEL_NETNS", "netns: not tried (not started through confine.py)")
    layers = [netns, *confine.apply(Path(scratch), read_only=[config.build_dir()])]
    hello = json.dumps({"layers": layers}).encode()
    sock.sendall(HEAD.pack(len(hello), OK, 0, 0) + hello)
    _Server(sock, fd_sock, fp).serve()


if __name__ == "__main__":
    serve(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
