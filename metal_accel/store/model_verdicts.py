"""Model-level verdicts: what the end-to-end stage decided for one model, so a warm optimize() skips it.

The end-to-end stage (model_choice.py) times the whole model against eager and against the model compiled
whole, then installs the whole-model compile, keeps the per-module choices or drops some of them. That takes
seconds to minutes (a whole-model compile, its proof, the timing rounds); its outcome depends only on the
model (class, source, configuration, parameter shapes), the example's call signature, the per-module choices
it started from, the settings that change a verdict, and the environment. So it is kept under a key of all of
these, in the user cache:

    <user cache>/models/<backend>/<key>.json

and sealed like a kernel's verdict (attest.py): only a verdict this user's library made and sealed skips the
stage; anything else (a copied file, an edited one, another device or torch) is ignored and the stage runs.
"""
from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from filelock import FileLock
from torch import nn

from ..core import config
from ..core.errors import MetalAccelError
from ..core.keys import module_fingerprint
from ..core.specs import call_signature
from ..core.verdict import Environment
from . import attest
from .index import atomic_write

log = logging.getLogger(__name__)
DIR_NAME = "models"
FORMAT_VERSION = 1
OUTCOMES = ("whole", "modules", "eager")   # the model compiled whole / per-module choices (some dropped) / none


@dataclass
class ModelVerdict:
    """The end-to-end stage's outcome for one model key in one environment."""

    outcome: str                                       # one of OUTCOMES
    dropped: list[str] = field(default_factory=list)   # choice groups dropped ("RMSNorm: compile")
    end_to_end: dict[str, Any] = field(default_factory=dict)   # model_choice.EndToEnd.to_dict() when it was made

    def content(self) -> dict[str, Any]:
        return {"outcome": self.outcome, "dropped": list(self.dropped), "end_to_end": self.end_to_end}


def model_key(model: nn.Module, args: tuple, kwargs: dict[str, Any], backend: str,
              choices: Sequence[tuple[str, str, str]], workload: str = "") -> str | None:
    """The key of MODEL's end-to-end verdict for this call and these per-module CHOICES (name, status, entry
    key); None when the model has no fingerprint (a class without source) or the call no signature."""
    try:
        fingerprint = module_fingerprint(model)
        signature = repr(call_signature(args, kwargs))
    except (MetalAccelError, TypeError):
        return None
    now = config.current()
    blob = {"v": FORMAT_VERSION, "model": fingerprint, "call": signature, "backend": backend,
            "choices": sorted(list(c) for c in choices), "workload": workload,
            "settings": {"precision": now.precision, "margin": now.margin, "compile": now.compile}}
    return hashlib.sha256(json.dumps(blob, sort_keys=True, default=repr).encode()).hexdigest()[:32]


def _path(backend: str, key: str) -> Path:
    return config.current().user_cache / DIR_NAME / backend / f"{key}.json"


def get(backend: str, key: str, env: Environment) -> ModelVerdict | None:
    """The sealed verdict for KEY in ENV, or None (absent, unreadable, unsealed or sealed for something else)."""
    path = _path(backend, key)
    try:
        doc = json.loads(path.read_text())
        verdict = doc["verdicts"][env.id]
        content = verdict["content"]
        if not attest.verify(key, "model", env.id, content, str(verdict.get("seal", ""))):
            log.info("metal_accel: ignoring the model-level verdict %s: it is not sealed by this user", path)
            return None
        if content["outcome"] not in OUTCOMES:
            return None
        return ModelVerdict(str(content["outcome"]), [str(d) for d in content.get("dropped", [])],
                            dict(content.get("end_to_end") or {}))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        log.info("metal_accel: ignoring the model-level verdict %s: %s", path, exc)
        return None


def put(backend: str, key: str, env: Environment, verdict: ModelVerdict) -> None:
    """Store VERDICT for KEY in ENV, sealed; other environments' verdicts in the file are kept. Never raises:
    a verdict that cannot be written only costs the next optimize() the stage again."""
    path = _path(backend, key)
    content = json.loads(json.dumps(verdict.content(), default=repr))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(path) + ".lock", timeout=60):
            try:
                doc = json.loads(path.read_text())
                verdicts = doc["verdicts"] if isinstance(doc.get("verdicts"), dict) else {}
            except (OSError, ValueError, AttributeError):
                verdicts = {}
            verdicts[env.id] = {"environment": env.to_dict(), "content": content,
                                "seal": attest.seal(key, "model", env.id, content)}
            atomic_write(path, json.dumps({"format": FORMAT_VERSION, "key": key, "verdicts": verdicts},
                                          indent=1, sort_keys=True))
    except Exception as exc:  # a full disk, a read-only cache: the next run decides again
        log.warning("metal_accel: the model-level verdict was not stored (%s: %s)", type(exc).__name__, exc)


__all__ = ["ModelVerdict", "OUTCOMES", "get", "model_key", "put"]
