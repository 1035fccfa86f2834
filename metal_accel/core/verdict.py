"""Where and how a candidate was judged: the environment of a verdict, the speed gate's numbers, the verdict."""
from __future__ import annotations

import hashlib
import json
import platform
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from .redact import redact, redact_obj


@dataclass(frozen=True)
class Environment:
    """Where a verdict was measured. Verdicts are only trusted in the same environment."""

    backend: str
    device_name: str
    os: str
    torch: str  # major.minor

    @property
    def id(self) -> str:
        blob = json.dumps(asdict(self), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def to_dict(self) -> dict[str, str]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Environment":
        return cls(**{k: str(data[k]) for k in ("backend", "device_name", "os", "torch")})


def torch_major_minor() -> str:
    return ".".join(torch.__version__.split("+")[0].split(".")[:2])


def os_description() -> str:
    system = platform.system()
    if system == "Darwin":
        return f"macOS {platform.mac_ver()[0].split('.')[0]}"
    return system


@dataclass
class BenchResult:
    eager_us: float          # median per call
    kernel_us: float
    speedup: float           # median eager / median kernel
    ratio_p25: float         # 25th percentile of per-pair eager/kernel ratios
    eager_spread: float      # interquartile range / median
    kernel_spread: float
    reps: int
    accepted: bool
    reason: str
    rejected_samples: int = 0  # samples a checking timer refused (e.g. CUDA events vs wall clock)
    ratio_low: float = 0.0     # lower 99% confidence bound of the median per-pair ratio (median_lower_bound)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Verdict:
    """The outcome of proving one candidate in one environment, with the numbers behind it."""

    env: Environment
    accepted: bool
    reason: str
    candidate_digest: str = ""
    speedup: float | None = None
    eager_us: float | None = None
    kernel_us: float | None = None
    details: dict[str, Any] = field(default_factory=dict)
    measured_at: float = field(default_factory=time.time)
    seal: str = ""  # this user's HMAC of the verdict (attest.py); '' on a claim
    fresh: bool = field(default=True, compare=False, repr=False)  # made by this process, not read; never stored

    def __post_init__(self) -> None:
        if self.fresh:  # reasons are shown and sent: no environment values, home paths or credentials
            self.scrub()

    def scrub(self) -> None:
        self.reason = redact(self.reason)
        self.details = redact_obj(self.details)

    def content(self) -> dict[str, Any]:
        """Everything the seal covers: the stored document without the seal."""
        return {"env": self.env.to_dict(), "accepted": self.accepted, "reason": self.reason,
                "candidate_digest": self.candidate_digest, "speedup": self.speedup,
                "eager_us": self.eager_us, "kernel_us": self.kernel_us, "details": self.details,
                "measured_at": self.measured_at}

    def to_dict(self) -> dict[str, Any]:
        return {**self.content(), "seal": self.seal}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Verdict":
        return cls(env=Environment.from_dict(d["env"]), accepted=bool(d["accepted"]), reason=str(d["reason"]),
                   candidate_digest=d.get("candidate_digest", ""), speedup=d.get("speedup"),
                   eager_us=d.get("eager_us"), kernel_us=d.get("kernel_us"), details=d.get("details", {}),
                   measured_at=float(d.get("measured_at", 0.0)), seal=str(d.get("seal", "")), fresh=False)
