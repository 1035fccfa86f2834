"""Model names: `openai:<model>`, `anthropic:<model>`, `openai-compatible:<base_url>#<model>`."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence
from urllib.parse import urlsplit, urlunsplit

from ..core import config
from ..core.errors import MetalAccelError

MODELS_ENV = "METAL_ACCEL_MODELS"
COMPATIBLE_KEY_ENV = "METAL_ACCEL_COMPATIBLE_API_KEY"
KINDS = ("openai", "anthropic", "openai-compatible")


class ProviderConfigError(MetalAccelError):
    """Synthesis was asked for but no usable LLM is configured (no model, no SDK, no key)."""


@dataclass(frozen=True)
class ModelSpec:
    """One LLM: which API, which model, and for openai-compatible servers the base URL."""

    kind: str            # "openai", "anthropic" or "openai-compatible"
    model: str
    base_url: str = ""   # openai-compatible only

    @property
    def label(self) -> str:
        """The name used in reports, logs and cache provenance: no credentials, no query string."""
        if self.kind == "openai-compatible":
            return f"{self.kind}:{_public_url(self.base_url)}#{self.model}"
        return f"{self.kind}:{self.model}"

    def __str__(self) -> str:
        return self.label


def _public_url(url: str) -> str:
    """`url` without user:password@ and without query or fragment (they may carry tokens)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    try:
        port = parts.port
    except ValueError:  # not a number: shown as given
        port = parts.netloc.rpartition(":")[2]
    if port:
        host = f"{host}:{port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def _shown(text: str) -> str:
    """A model name as quoted in error messages: URLs without credentials or query."""
    kind, _, rest = text.partition(":")
    if "://" not in text:
        return text
    base, hash_, model = rest.rpartition("#") if "#" in rest else (rest, "", "")
    return f"{kind}:{_public_url(base)}{hash_}{model}"


def _valid_base_url(url: str) -> bool:
    """An http(s) URL with a host and, if any, a numeric port: something a client could reach."""
    try:
        parts = urlsplit(url)
        parts.port  # raises ValueError for a port that is not a number
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def parse_model(spec: str) -> ModelSpec:
    """Parse one model name; raise ProviderConfigError saying what is expected."""
    text = spec.strip()
    kind, sep, rest = text.partition(":")
    if not sep or kind not in KINDS or not rest:
        raise ProviderConfigError(
            f"bad model name {_shown(text)!r}: expected 'openai:<model>', "
            "'anthropic:<model>' or 'openai-compatible:<base_url>#<model>'")
    if kind == "openai-compatible":
        base_url, hash_, model = rest.rpartition("#")
        if not hash_ or not base_url or not model or not _valid_base_url(base_url):
            raise ProviderConfigError(
                "bad model name for an OpenAI-compatible server: expected "
                "'openai-compatible:<base_url>#<model>', e.g. 'openai-compatible:http://localhost:11434/v1#qwen2.5-coder', "
                f"got {_shown(text)!r}")
        return ModelSpec(kind, model, base_url)
    return ModelSpec(kind, rest)


def parse_models(specs: Iterable[str | ModelSpec]) -> list[ModelSpec]:
    """Parse several model names (strings or ModelSpec), dropping duplicates, keeping order."""
    out: list[ModelSpec] = []
    for s in specs:
        m = s if isinstance(s, ModelSpec) else parse_model(s)
        if m not in out:
            out.append(m)
    return out


def models_from_env() -> list[ModelSpec]:
    """The models named by METAL_ACCEL_MODELS (comma-separated); empty when unset."""
    return parse_models(config.current().models)


def resolve_models(models: Sequence[str | ModelSpec] | str | None) -> list[ModelSpec]:
    """Models from the argument (a list or a comma-separated string), else from the environment."""
    if isinstance(models, str):
        models = [p for p in models.split(",") if p.strip()]
    if models:
        return parse_models(models)
    return models_from_env()


def is_model_spec(text: str) -> bool:
    """Whether a provider string names an LLM (rather than e.g. a candidate directory)."""
    return text.partition(":")[0] in KINDS
