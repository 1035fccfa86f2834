"""Knobs of the synthesis loop, with defaults and environment overrides (read through core/config.py)."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
import re
from typing import Any, Mapping

from ..core import config
from .budget import DEFAULT_MODULE_LIMITS, DEFAULT_RUN_LIMITS, PRICES_ENV, Limits, parse_prices

THINKING_MODES = ("off", "enabled", "adaptive")
# OpenAI models whose completion tokens include hidden reasoning: o1, o3, o4-mini, ..., gpt-5 (not its chat variant).
_OPENAI_REASONING = re.compile(r"^(o\d+(?![\w.])|o\d+-|gpt-5(?!-chat)(?![\d]))")


@dataclass(frozen=True)
class SynthSettings:
    """How hard to try, how much to spend, how to talk to the providers.

    Environment overrides (read by `from_env`): METAL_ACCEL_SAMPLES, METAL_ACCEL_REPAIR_ROUNDS, METAL_ACCEL_SPEED_ROUNDS,
    METAL_ACCEL_CONCURRENCY, METAL_ACCEL_PROBLEMS, METAL_ACCEL_MAX_TOKENS, METAL_ACCEL_MAX_COST_USD, METAL_ACCEL_MAX_WALL_S
    (per run), METAL_ACCEL_MODULE_MAX_TOKENS, METAL_ACCEL_MODULE_MAX_COST_USD,
    METAL_ACCEL_MODULE_MAX_WALL_S (per module), METAL_ACCEL_LLM_TIMEOUT_S, METAL_ACCEL_LLM_DEADLINE_S,
    METAL_ACCEL_PRICES ('name=IN/OUT,...', USD per million tokens), METAL_ACCEL_ANSWER_TOKENS,
    METAL_ACCEL_REASONING_TOKENS, METAL_ACCEL_REASONING_EFFORT, METAL_ACCEL_THINKING,
    METAL_ACCEL_REASONING_MODELS (comma-separated), METAL_ACCEL_ANSWER_CACHE (0: ask again, keep nothing).

    Output budgets: `max_output_tokens` is the answer's own (code and a few lines of prose). A model
    that reasons gets `reasoning_tokens` more, so that its reasoning cannot eat the answer: OpenAI
    reasoning models (o1, o3, o4, gpt-5 families, and any named in `reasoning_models`) are sent
    `max_completion_tokens = max_output_tokens + reasoning_tokens`; Anthropic models, with `thinking`
    "enabled", are sent `thinking.budget_tokens = reasoning_tokens` and `max_tokens = max_output_tokens +
    reasoning_tokens` ("adaptive": the model sizes its thinking within the same sum); OpenAI-compatible
    models named in `reasoning_models` (e.g. a local DeepSeek-R1 or Qwen3) get the same sum as `max_tokens`.
    """

    samples: int = 2                    # independent conversations per model
    repair_rounds: int = 5              # answers fed back with the verdict, after the first
    speed_rounds: int = 2               # more answers after a correct kernel while it is not the fastest
    concurrency: int = 4                # LLM requests in flight at once (over all problems in flight)
    problems: int = 2                   # `metal-accel synth`: problems in flight at once (device work takes turns)
    max_output_tokens: int = 8192       # per answer, reasoning not included
    reasoning_tokens: int = 16384       # extra output budget of a model that reasons (see above); 0: none
    reasoning_effort: str | None = None  # OpenAI reasoning models: "minimal".."high"; None: the provider's default
    thinking: str = "off"               # Anthropic extended thinking: "off", "enabled" or "adaptive"
    reasoning_models: tuple[str, ...] = ()  # more model names (exact, or a prefix ending in '*') that reason
    temperature: float | None = None    # None: the provider's default
    request_timeout_s: float = 600.0    # per HTTP attempt (the SDK's timeout)
    request_deadline_s: float = 1200.0  # per request, all attempts and retries together
    sdk_max_retries: int = 1            # the SDK's own retries (429 with retry-after, 5xx, timeouts)
    extra_retries: int = 2              # ours, after the SDK gave up on a retryable error (each one logged)
    retry_backoff_s: float = 2.0        # base of our exponential backoff
    module_limits: Limits = DEFAULT_MODULE_LIMITS
    run_limits: Limits = DEFAULT_RUN_LIMITS
    prices: Mapping[str, tuple[float, float]] = field(default_factory=dict)  # USD/M tokens by exact name or 'prefix*'
    only_classes: tuple[str, ...] = ()  # synthesize only these classes (name or qualified path); () = all
    profile: bool = True                # profiles in prompts: the eager forward, and a kernel in speed rounds
    references: bool = True             # include reference kernels from the caches
    progress: bool | None = None        # tqdm bars; None: when attached to a terminal
    answer_cache: bool = True           # keep answers by exact request and replay them (METAL_ACCEL_ANSWER_CACHE=0: off)

    def with_(self, **changes: Any) -> "SynthSettings":
        return replace(self, **changes)

    def reasons(self, kind: str, model: str) -> bool:
        """Whether requests to `model` (of API `kind`) get the reasoning budget on top of the answer's."""
        if self.reasoning_tokens <= 0:
            return False
        if any(model == p or (p.endswith("*") and model.startswith(p[:-1])) for p in self.reasoning_models):
            return True
        if kind == "anthropic":
            return self.thinking != "off"
        return kind == "openai" and bool(_OPENAI_REASONING.match(model))

    def output_budget(self, kind: str, model: str) -> int:
        """The output-token limit sent with a request (answer, plus reasoning where the model reasons)."""
        return self.max_output_tokens + (self.reasoning_tokens if self.reasons(kind, model) else 0)

    def wants(self, class_name: str, module_class: str) -> bool:
        return not self.only_classes or class_name in self.only_classes or module_class in self.only_classes

    @classmethod
    def from_env(cls, **overrides: Any) -> "SynthSettings":
        """Defaults, then environment variables, then `overrides`."""
        environ = config.environment()
        env: dict[str, Any] = {}
        for name, key, conv in (("METAL_ACCEL_SAMPLES", "samples", int),
                                ("METAL_ACCEL_REPAIR_ROUNDS", "repair_rounds", int),
                                ("METAL_ACCEL_SPEED_ROUNDS", "speed_rounds", int),
                                ("METAL_ACCEL_CONCURRENCY", "concurrency", int),
                                ("METAL_ACCEL_PROBLEMS", "problems", int),
                                ("METAL_ACCEL_LLM_TIMEOUT_S", "request_timeout_s", float),
                                ("METAL_ACCEL_LLM_DEADLINE_S", "request_deadline_s", float),
                                ("METAL_ACCEL_ANSWER_TOKENS", "max_output_tokens", int),
                                ("METAL_ACCEL_REASONING_TOKENS", "reasoning_tokens", int),
                                ("METAL_ACCEL_REASONING_EFFORT", "reasoning_effort", str),
                                ("METAL_ACCEL_THINKING", "thinking", str)):
            if environ.get(name):
                env[key] = conv(environ[name])
        if environ.get("METAL_ACCEL_ANSWER_CACHE"):
            env["answer_cache"] = environ["METAL_ACCEL_ANSWER_CACHE"] not in ("0", "off", "false")
        if environ.get("METAL_ACCEL_REASONING_MODELS"):
            env["reasoning_models"] = tuple(p.strip() for p in environ["METAL_ACCEL_REASONING_MODELS"].split(",")
                                            if p.strip())
        if environ.get(PRICES_ENV):
            env["prices"] = parse_prices(environ[PRICES_ENV])
        env["run_limits"] = _limits_from_env(environ, "METAL_ACCEL_", DEFAULT_RUN_LIMITS)
        env["module_limits"] = _limits_from_env(environ, "METAL_ACCEL_MODULE_", DEFAULT_MODULE_LIMITS)
        out = cls(**{**env, **overrides})
        if out.thinking not in THINKING_MODES:
            raise ValueError(f"thinking must be one of {', '.join(THINKING_MODES)}, got {out.thinking!r}")
        return out


def _limits_from_env(environ: Mapping[str, str], prefix: str, default: Limits) -> Limits:
    def get(name: str, conv: type, fallback: Any) -> Any:
        raw = environ.get(prefix + name, "")
        if raw == "":
            return fallback
        return None if raw.lower() in ("none", "inf", "off") else conv(float(raw))
    return Limits(tokens=get("MAX_TOKENS", int, default.tokens), cost_usd=get("MAX_COST_USD", float, default.cost_usd),
                  wall_s=get("MAX_WALL_S", float, default.wall_s))
