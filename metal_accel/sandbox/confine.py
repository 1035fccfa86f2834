"""Confinement of the process that runs untrusted kernels (the worker).

`apply(scratch, read_only, read_write)` confines the calling process for good, before untrusted code
loads; it returns the layers applied, and names each one it could not apply with the reason (a warning
is logged once per missing layer). On Linux:

- resource limits: no core files, files of at most 1 GiB, 256 open files;
- no new privileges (PR_SET_NO_NEW_PRIVS);
- Landlock (kernel ABI 1 and later): read-only access to the Python install, its site-packages, this
  package, system library directories and the READ_ONLY paths; read-write access to SCRATCH and the
  READ_WRITE paths only; no file may be executed; ABI 4+: no TCP bind or connect; ABI 6+: no signals
  to processes outside the sandbox, no abstract unix sockets;
- seccomp (libseccomp through pyseccomp): EPERM for sockets, exec, new processes (clone without
  CLONE_THREAD, fork, vfork; clone3 answers ENOSYS so glibc falls back to clone), ptrace and
  process_vm_*, namespaces and mounts, keyrings, bpf, perf events, io_uring, signals to other processes.

Run as a script (`python .../confine.py -m MODULE ARGS...`) this file first moves the process into new user
and network namespaces where the kernel permits (a process must still be single-threaded for that, so
before torch is imported), then runs MODULE as __main__. That layer is optional: the others do not
depend on it. It imports nothing of this package, so the script form starts no torch.

macOS: `apply` calls sandbox_init with a profile denying network and file writes outside SCRATCH.
That path is UNTESTED (no Mac was at hand); the layer is named "sandbox (macOS, untested)".
Where neither filesystem nor syscall confinement applies, `sufficient` says so and the caller refuses
untrusted native code unless METAL_ACCEL_UNCONFINED=1.
"""
from __future__ import annotations

import ctypes
import errno
import logging
import os
import platform
import resource
import shutil
import sys
import sysconfig
from pathlib import Path
from typing import Sequence


try:  # optional (libseccomp); imported now, since finding the library runs ldconfig, which confinement forbids
    import pyseccomp
    _SECCOMP_ERROR = ""
except (ImportError, OSError, RuntimeError) as _exc:
    pyseccomp = None
    _SECCOMP_ERROR = f"pyseccomp/libseccomp not importable: {_exc}"

log = logging.getLogger(__name__)

UNCONFINED_ENV = "METAL_ACCEL_UNCONFINED"  # =1: run untrusted native code even where nothing confines it
FILE_SIZE_LIMIT = 1 << 30
OPEN_FILES_LIMIT = 256
FS_LAYER, SYSCALL_LAYER = "landlock", "seccomp"
_THREAD_SETTINGS = ("OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_", "VECLIB_MAXIMUM_THREADS", "NUMEXPR_")
_KEPT = ("CXX", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "LD_LIBRARY_PATH")
# switches some hosts set for every process (e.g. NVLink multicast off for NCCL, NVSHMEM and PyTorch)
_HOST_SETTINGS = ("NCCL_", "NVSHMEM_", "TORCH_SYMM_MEM_")
_warned: set[str] = set()

# ---------------------------------------------------------------- environment


def scrubbed_environment(scratch: Path, parent: dict[str, str] | None = None) -> dict[str, str]:
    """The child's whole environment: locale C, HOME/TMPDIR = SCRATCH, thread settings, the compiler's
    directory on PATH, CXX and the CUDA device selection; nothing else of PARENT (default os.environ)."""
    parent = dict(os.environ if parent is None else parent)
    env = {k: v for k, v in parent.items() if k in _KEPT or k.startswith(_THREAD_SETTINGS + _HOST_SETTINGS)}
    path_dirs: list[str] = []
    for name in (parent.get("CXX"), "c++", "g++", "clang++"):
        found = shutil.which(name, path=parent.get("PATH")) if name else None
        if found and os.path.dirname(found) not in path_dirs:
            path_dirs.append(os.path.dirname(found))
    for d in ("/usr/local/bin", "/usr/bin", "/bin"):
        if d not in path_dirs:
            path_dirs.append(d)
    s = str(scratch)
    env.update(PATH=os.pathsep.join(path_dirs), LANG="C", LC_ALL="C", HOME=s, TMPDIR=s, TMP=s, TEMP=s,
               XDG_CACHE_HOME=os.path.join(s, ".cache"), PYTHONDONTWRITEBYTECODE="1", PYTHONUNBUFFERED="1")
    code_dirs = python_path_dirs(parent.get("PYTHONPATH", ""))
    if code_dirs:  # where the parent's packages (or this checkout) are imported from
        env["PYTHONPATH"] = os.pathsep.join(code_dirs)
    return env


def python_path_dirs(python_path: str) -> list[str]:
    """The directories of PYTHONPATH a confined child may read packages from: existing ones, never the home
    directory or a folder holding it (what lies there is the user's, not code)."""
    home = Path.home().resolve()
    kept = []
    for entry in python_path.split(os.pathsep):
        d = Path(entry).resolve() if entry else None
        if d is not None and d.is_dir() and d != home and d not in home.parents and str(d) not in kept:
            kept.append(str(d))
    return kept


# ---------------------------------------------------------------- layers


def _limits() -> None:
    def cap(which: int, value: int) -> None:
        soft, hard = resource.getrlimit(which)
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(which, (value, value))
    cap(resource.RLIMIT_CORE, 0)
    cap(resource.RLIMIT_FSIZE, FILE_SIZE_LIMIT)
    cap(resource.RLIMIT_NOFILE, OPEN_FILES_LIMIT)


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
PR_SET_NO_NEW_PRIVS = 38


def _no_new_privs() -> None:
    if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))


# Landlock (include/uapi/linux/landlock.h); the syscall numbers are the same on x86_64 and aarch64
_LL_CREATE, _LL_ADD_RULE, _LL_RESTRICT = 444, 445, 446
_LL_VERSION_FLAG = 1
_LL_RULE_PATH, _LL_RULE_PORT = 1, 2
EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
REMOVE_DIR, REMOVE_FILE, MAKE_CHAR, MAKE_DIR, MAKE_REG = 1 << 4, 1 << 5, 1 << 6, 1 << 7, 1 << 8
MAKE_SOCK, MAKE_FIFO, MAKE_BLOCK, MAKE_SYM, REFER, TRUNCATE, IOCTL_DEV = (1 << i for i in range(9, 16))
_FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV  # the rights a rule on a non-directory may carry
NET_BIND_TCP, NET_CONNECT_TCP = 1, 2
SCOPE_ABSTRACT_UNIX, SCOPE_SIGNAL = 1, 2


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 where there is none (or not Linux)."""
    if not sys.platform.startswith("linux") or platform.machine() not in ("x86_64", "aarch64"):
        return 0
    v = _libc.syscall(_LL_CREATE, None, ctypes.c_size_t(0), ctypes.c_uint32(_LL_VERSION_FLAG))
    return max(int(v), 0)


def _fs_rights(abi: int) -> int:
    rights = (1 << 13) - 1
    if abi >= 2:
        rights |= REFER
    if abi >= 3:
        rights |= TRUNCATE
    if abi >= 5:
        rights |= IOCTL_DEV
    return rights


def _system_read_paths() -> list[str]:
    """What the worker's Python, torch and a loaded kernel read after confinement."""
    prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    paths = set(prefixes) | {p for p in sysconfig.get_paths().values() if p}
    for entry in sys.path:  # site-packages outside the prefixes (user site, vendor dirs); never a bare checkout
        if entry and ("site-packages" in entry or "dist-packages" in entry or any(entry.startswith(p) for p in prefixes)):
            paths.add(entry)
    paths |= set(python_path_dirs(os.environ.get("PYTHONPATH", "")))
    paths |= {str(Path(__file__).resolve().parent.parent), "/usr", "/lib", "/lib64", "/etc/ld.so.cache", "/etc/localtime",
              "/proc/self", "/proc/cpuinfo", "/proc/meminfo", "/proc/stat", "/sys/devices/system/cpu",
              "/dev/urandom", "/dev/random"}
    return sorted(paths)


def _landlock(scratch: Path, read_only: Sequence[Path], read_write: Sequence[Path]) -> list[str]:
    abi = landlock_abi()
    if abi < 1:
        raise OSError(errno.ENOSYS, "the kernel has no Landlock (Linux 5.13+ with landlock enabled in the LSM list)")
    attr = _RulesetAttr(_fs_rights(abi), NET_BIND_TCP | NET_CONNECT_TCP if abi >= 4 else 0,
                        SCOPE_ABSTRACT_UNIX | SCOPE_SIGNAL if abi >= 6 else 0)
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    fd = _libc.syscall(_LL_CREATE, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if fd < 0:
        raise OSError(ctypes.get_errno(), f"landlock_create_ruleset: {os.strerror(ctypes.get_errno())}")
    handled = attr.fs
    read = READ_FILE | READ_DIR
    write = read | WRITE_FILE | REMOVE_DIR | REMOVE_FILE | MAKE_DIR | MAKE_REG | MAKE_SYM | REFER | TRUNCATE
    grants = [(p, read) for p in [*_system_read_paths(), *map(str, read_only)]]
    grants += [(p, write) for p in [str(scratch), *map(str, read_write)]]
    grants.append(("/dev/null", READ_FILE | WRITE_FILE | TRUNCATE))
    try:
        for path, rights in grants:
            try:
                pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue  # absent here: nothing to grant
            try:
                if not os.path.isdir(path):
                    rights &= _FILE_RIGHTS
                rule = _PathBeneath(rights & handled, pfd)
                if _libc.syscall(_LL_ADD_RULE, ctypes.c_int(fd), ctypes.c_int(_LL_RULE_PATH), ctypes.byref(rule),
                                 ctypes.c_uint32(0)) != 0:
                    raise OSError(ctypes.get_errno(), f"landlock_add_rule({path}): {os.strerror(ctypes.get_errno())}")
            finally:
                os.close(pfd)
        if _libc.syscall(_LL_RESTRICT, ctypes.c_int(fd), ctypes.c_uint32(0)) != 0:
            raise OSError(ctypes.get_errno(), f"landlock_restrict_self: {os.strerror(ctypes.get_errno())}")
    finally:
        os.close(fd)
    layers = [f"{FS_LAYER} (filesystem, ABI {abi})"]
    if abi >= 4:
        layers.append("landlock-net (no TCP bind/connect)")
    if abi >= 6:
        layers.append("landlock-scope (no signals out, no abstract unix sockets)")
    return layers


_DENIED_SYSCALLS = (
    "socket", "socketpair", "connect", "bind", "listen", "accept", "accept4", "sendmsg", "sendmmsg",
    "execve", "execveat", "fork", "vfork", "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd",
    "pidfd_open", "pidfd_send_signal", "tkill", "mount", "umount2", "pivot_root", "chroot", "unshare", "setns",
    "keyctl", "add_key", "request_key", "bpf", "perf_event_open", "personality", "userfaultfd",
    "io_uring_setup", "io_uring_enter", "io_uring_register", "init_module", "finit_module", "delete_module",
    "kexec_load", "kexec_file_load", "reboot", "swapon", "swapoff", "open_by_handle_at", "name_to_handle_at",
    "fsopen", "fsmount", "move_mount", "open_tree", "mount_setattr",
)
CLONE_THREAD = 0x10000


def _seccomp() -> list[str]:
    sc = pyseccomp
    if sc is None:
        raise OSError(errno.ENOSYS, _SECCOMP_ERROR)
    f = sc.SyscallFilter(sc.ALLOW)
    deny = sc.ERRNO(errno.EPERM)
    unknown = []
    for name in _DENIED_SYSCALLS:
        try:
            f.add_rule(deny, name)
        except (ValueError, RuntimeError, OSError):
            unknown.append(name)  # not a syscall of this architecture
    f.add_rule(deny, "clone", sc.Arg(0, sc.MASKED_EQ, CLONE_THREAD, 0))  # a thread, never a process
    f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")  # its flags sit behind a pointer: glibc falls back to clone
    f.add_rule(deny, "sendto", sc.Arg(4, sc.NE, 0))  # to an address
    pid = os.getpid()
    for name in ("kill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo"):
        f.add_rule(deny, name, sc.Arg(0, sc.NE, pid))
    f.load()  # also sets no_new_privs
    return [SYSCALL_LAYER + (f" (absent here: {', '.join(unknown)})" if unknown else "")]


def _macos_sandbox(scratch: Path, read_write: Sequence[Path]) -> list[str]:
    """UNTESTED: sandbox_init with an SBPL profile: no network, no writes outside SCRATCH and READ_WRITE,
    no exec or fork. Reads stay allowed (the profile language makes a read allowlist brittle)."""
    def quote(p: Path | str) -> str:
        return '"' + str(Path(p).resolve()).replace("\\", "\\\\").replace('"', '\\"') + '"'
    writable = " ".join(f"(subpath {quote(p)})" for p in [scratch, *read_write])
    profile = ("(version 1)(allow default)(deny network*)(deny process-exec*)(deny process-fork)"
               f"(deny file-write*)(allow file-write* {writable} (literal \"/dev/null\"))")
    lib = ctypes.CDLL("/usr/lib/libSystem.B.dylib")
    err = ctypes.c_char_p()
    if lib.sandbox_init(profile.encode(), ctypes.c_uint64(0), ctypes.byref(err)) != 0:
        raise OSError(errno.EPERM, f"sandbox_init: {err.value.decode(errors='replace') if err.value else 'failed'}")
    return ["sandbox (macOS, untested)"]


# ---------------------------------------------------------------- entry points


def _missing(layer: str, why: object) -> str:
    entry = f"{layer}: not applied ({why})"
    if layer not in _warned:
        _warned.add(layer)
        log.warning("metal_accel: worker confinement: %s", entry)
    return entry


def apply(scratch: Path, read_only: Sequence[Path] = (), read_write: Sequence[Path] = ()) -> list[str]:
    """Confine this process for good: HOME, TMPDIR and cwd become SCRATCH, then every layer this platform
    has. Returns each layer applied by name, and each missing one as "<layer>: not applied (<why>)"."""
    scratch = Path(scratch).resolve()
    scratch.mkdir(parents=True, exist_ok=True)
    os.chdir(scratch)
    for var in ("HOME", "TMPDIR", "TMP", "TEMP"):
        os.environ[var] = str(scratch)
    layers = ["scratch cwd/HOME/TMPDIR"]
    try:
        _limits()
        layers.append("rlimits (no core, 1 GiB files, 256 fds)")
    except (OSError, ValueError) as exc:
        layers.append(_missing("rlimits", exc))
    if sys.platform == "darwin":
        try:
            layers += _macos_sandbox(scratch, read_write)
        except (OSError, AttributeError) as exc:
            layers.append(_missing("sandbox", exc))
        return layers
    if not sys.platform.startswith("linux"):
        return layers + [_missing(FS_LAYER, f"not Linux ({sys.platform})"), _missing(SYSCALL_LAYER, "not Linux")]
    try:
        _no_new_privs()
        layers.append("no_new_privs")
    except OSError as exc:
        layers.append(_missing("no_new_privs", exc))
    try:
        layers += _landlock(scratch, read_only, read_write)
    except OSError as exc:
        layers.append(_missing(FS_LAYER, exc.strerror or exc))
    try:
        layers += _seccomp()
    except (OSError, RuntimeError, ValueError) as exc:
        layers.append(_missing(SYSCALL_LAYER, exc.strerror if isinstance(exc, OSError) and exc.strerror else exc))
    return layers


def sufficient(layers: Sequence[str]) -> bool:
    """Whether LAYERS (from apply) confine files or syscalls at all: without either, untrusted native code
    must not run unless the user opted out (METAL_ACCEL_UNCONFINED=1)."""
    return any(l.split(" ")[0] in (FS_LAYER, SYSCALL_LAYER, "sandbox") and "not applied" not in l for l in layers)



def describe() -> dict[str, object]:
    """What this platform can confine (for `metal-accel doctor`); applies nothing."""
    info: dict[str, object] = {"platform": sys.platform,  # the opt-out as core/config.py reads it
                               "unconfined_opt_out": os.environ.get(UNCONFINED_ENV, "") not in ("", "0")}
    if sys.platform == "darwin":
        info["sandbox"] = "sandbox_init profile (untested): no network, no writes outside scratch, no exec"
        return info
    abi = landlock_abi()
    info["landlock_abi"] = abi
    info["landlock"] = ("filesystem" + (", TCP" if abi >= 4 else "") + (", signals" if abi >= 6 else "")) if abi else "absent"
    info["seccomp"] = "available (pyseccomp)" if pyseccomp is not None else f"absent: {_SECCOMP_ERROR}"
    info["network_namespace"] = "tried at worker start; optional"
    info["confined"] = bool(abi) or info["seccomp"].startswith("available")
    return info


# ---------------------------------------------------------------- launcher (script form)


def isolate_network() -> str:
    """Move this (single-threaded) process into new user and network namespaces, uid/gid mapped to
    themselves: a layer name, or why not. Optional: every other layer stands without it."""
    CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
    uid, gid = os.getuid(), os.getgid()
    if _libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0:
        return f"netns: not applied ({os.strerror(ctypes.get_errno())})"
    try:
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    except OSError as exc:
        return f"netns (uids unmapped: {exc.strerror})"
    return "netns (no network interfaces)"


def _launch(argv: list[str]) -> None:
    import runpy
    if len(argv) < 2 or argv[0] != "-m":
        raise SystemExit("usage: confine.py -m MODULE [ARGS...]")
    sys.path.pop(0)  # this file's directory: its modules must not shadow top-level ones
    os.environ["METAL_ACCEL_NETNS"] = isolate_network() if sys.platform.startswith("linux") else "netns: not Linux"
    sys.argv = [argv[1], *argv[2:]]
    runpy.run_module(argv[1], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    _launch(sys.argv[1:])
