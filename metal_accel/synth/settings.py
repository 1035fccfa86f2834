"""Knobs of the synthesis loop, with defaults and environment overrides (read through core/config.py)."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from ..core import config
from .budget import DEFAULT_MODULE_LIMITS, DEFAULT_RUN_LIMITS, Limits


@dataclass(frozen=True)
class SynthSettings:
    """How hard to try, how much to spend, how to talk to the providers.

    Environment overrides (read by `from_env`): METAL_ACCEL_SAMPLES, METAL_ACCEL_REPAIR_ROUNDS,
    METAL_ACCEL_CONCURRENCY, METAL_ACCEL_MAX_TOKENS, METAL_ACCEL_MAX_COST_USD, METAL_ACCEL_MAX_WALL_S
    (per run), METAL_ACCEL_MODULE_MAX_TOKENS, METAL_ACCEL_MODULE_MAX_COST_USD,
    METAL_ACCEL_MODULE_MAX_WALL_S (per module), METAL_ACCEL_LLM_TIMEOUT_S.
    """

    samples: int = 2                    # independent conversations per model
    repair_rounds: int = 5              # answers fed back with the verdict, after the first
    concurrency: int = 4                # LLM requests in flight at once
    max_output_tokens: int = 8192       # per answer
    temperature: float | None = None    # None: the provider's default
    request_timeout_s: float = 600.0    # per HTTP request (the SDK's timeout)
    sdk_max_retries: int = 3            # the SDK's own retries (429 with retry-after, 5xx, timeouts)
    extra_retries: int = 2              # ours, after the SDK gave up on a retryable error
    retry_backoff_s: float = 2.0        # base of our exponential backoff
    module_limits: Limits = DEFAULT_MODULE_LIMITS
    run_limits: Limits = DEFAULT_RUN_LIMITS
    prices: Mapping[str, tuple[float, float]] = field(default_factory=dict)  # extra/overriding prices
    only_classes: tuple[str, ...] = ()  # synthesize only these classes (name or qualified path); () = all
    profile: bool = True                # include a torch.profiler breakdown of the eager forward
    references: bool = True             # include reference kernels from the caches
    progress: bool | None = None        # tqdm bars; None: when attached to a terminal

    def with_(self, **changes: Any) -> "SynthSettings":
        return replace(self, **changes)

    def wants(self, class_name: str, module_class: str) -> bool:
        return not self.only_classes or class_name in self.only_classes or module_class in self.only_classes

    @classmethod
    def from_env(cls, **overrides: Any) -> "SynthSettings":
        """Defaults, then environment variables, then `overrides`."""
        environ = config.environment()
        env: dict[str, Any] = {}
        for name, key, conv in (("METAL_ACCEL_SAMPLES", "samples", int),
                                ("METAL_ACCEL_REPAIR_ROUNDS", "repair_rounds", int),
                                ("METAL_ACCEL_CONCURRENCY", "concurrency", int),
                                ("METAL_ACCEL_LLM_TIMEOUT_S", "request_timeout_s", float)):
            if environ.get(name):
                env[key] = conv(environ[name])
        env["run_limits"] = _limits_from_env(environ, "METAL_ACCEL_", DEFAULT_RUN_LIMITS)
        env["module_limits"] = _limits_from_env(environ, "METAL_ACCEL_MODULE_", DEFAULT_MODULE_LIMITS)
        return cls(**{**env, **overrides})


def _limits_from_env(environ: Mapping[str, str], prefix: str, default: Limits) -> Limits:
    def get(name: str, conv: type, fallback: Any) -> Any:
        raw = environ.get(prefix + name, "")
        if raw == "":
            return fallback
        return None if raw.lower() in ("none", "inf", "off") else conv(float(raw))
    return Limits(tokens=get("MAX_TOKENS", int, default.tokens), cost_usd=get("MAX_COST_USD", float, default.cost_usd),
                  wall_s=get("MAX_WALL_S", float, default.wall_s))
