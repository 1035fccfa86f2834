"""Turn optimize()'s `providers`, `synthesize` and `models` arguments into provider objects."""
from __future__ import annotations

import logging
from typing import Any, Iterable, Sequence

from ..core import config
from ..library.provider import LibraryProvider
from ..synth.loop import SynthesisLoop
from ..synth.models import ModelSpec, ProviderConfigError, is_model_spec
from ..synth.settings import SynthSettings
from .directory import DirectoryProvider

log = logging.getLogger(__name__)


def provider_from_spec(spec: str) -> Any:
    """Build a provider from a string: "dir:PATH", or one LLM ("openai:<model>", "anthropic:<model>",
    "openai-compatible:<base_url>#<model>"; see synth/models.py)."""
    kind, _, arg = spec.partition(":")
    if kind == "dir" and arg:
        return DirectoryProvider(arg)
    if is_model_spec(spec):
        return SynthesisLoop([spec])
    raise ValueError(f"unknown provider {spec!r}; expected 'dir:PATH' or a model name such as 'openai:<model>'")


def build_providers(providers: Iterable[Any] | None = None, *, synthesize: bool | None = None,
                    models: Sequence[str | ModelSpec] | str | None = None, settings: SynthSettings | None = None,
                    strict: bool = False, progress: bool | None = None) -> list[Any]:
    """Provider objects, in the order their candidates are tried: the shipped kernel library first (unless
    the `library` setting is off), then the given ones.

    Strings in `providers` are "dir:PATH" or model names; all model names (from `providers` and
    `models`) share one SynthesisLoop, so they race concurrently. `synthesize=None` means: synthesize
    when a model is named. `synthesize=True` with no model named reads METAL_ACCEL_MODELS; when no
    usable model results, `strict` raises ProviderConfigError, otherwise a warning is logged and
    every module's report says why nothing was synthesized.
    """
    out: list[Any] = [LibraryProvider()] if config.current().library else []
    names: list[str | ModelSpec] = []
    for p in providers or []:
        if isinstance(p, str) and is_model_spec(p):
            names.append(p)
        elif isinstance(p, str):
            out.append(provider_from_spec(p))
        else:
            out.append(p)
    if isinstance(models, str):
        models = [m for m in models.split(",") if m.strip()]
    names = list(models or []) + names
    if synthesize is None:
        synthesize = bool(names)
    if not synthesize:
        return out
    settings = settings or SynthSettings.from_env()
    if progress is not None and settings.progress is None:
        settings = settings.with_(progress=progress)
    loop = SynthesisLoop(names or None, settings)
    problem = loop.configuration_error
    if problem:
        if strict:
            raise ProviderConfigError(problem)
        if not loop.models:  # (unusable models were already logged one by one)
            log.warning("metal_accel: %s", problem)
    out.append(loop)
    return out
