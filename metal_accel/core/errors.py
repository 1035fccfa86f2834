"""Exceptions raised by metal_accel. Each carries a human-readable reason."""


class MetalAccelError(Exception):
    """Base class of every error metal_accel raises."""


class CandidateFormatError(MetalAccelError):
    """A candidate's text is not one Python block defining SOURCE and forward()."""


class SandboxError(MetalAccelError):
    """Host code uses a construct outside the sandbox whitelist."""

    def __init__(self, construct: str, lineno: int | None, detail: str = "") -> None:
        self.construct = construct
        self.lineno = lineno
        where = f"line {lineno}: " if lineno is not None else ""
        super().__init__(f"{where}{construct}" + (f" ({detail})" if detail else ""))


class CompileError(MetalAccelError):
    """The backend's compiler rejected a kernel source; the message holds its diagnostics."""


class KernelLaunchError(MetalAccelError):
    """A kernel was called with arguments that do not match its signature."""


class BackendUnavailableError(MetalAccelError):
    """The requested backend cannot run on this machine."""


class CacheError(MetalAccelError):
    """A cache entry is unreadable, malformed or failed its checks."""
