"""Keep what was paid for: LLM answers by exact request, each module's prompt, run journals.

Layout, in the user cache (`metal-accel cache clear` removes it):

    synth/<backend>/<entry key>/prompt.json        the task prompt asked with (reused, so a rerun asks the same)
    synth/<backend>/<entry key>/signature.json     what the module computes (its aten op multiset, hashed)
    synth/<backend>/<entry key>/<request sha>.json  one answer: the request (model, system prompt, messages,
                                                    parameters), the answer, its usage, and what became of it
    synth/runs/<run sha>.jsonl                     problems a `metal-accel synth` run finished

The request key is the sha256 of the model label (credentials and query strings already dropped),
the SDK call's arguments (never a key: those live in the SDK client) and the conversation's sample
number (two samples of one prompt are independent answers, not one). Each answer file is the
transcript of its conversation up to and including that answer, plus the feedback that followed.
"""
from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path
from typing import Any, Mapping

from ..core import config
from ..core.scrub import scrub
from ..store.index import atomic_write
from .clients import Completion
from .prompts import Prompt

log = logging.getLogger(__name__)
FORMAT = 1
DIR = "synth"
PROMPT_VERSION = 2  # bump when the prompt's content changes, so saved prompts are rebuilt


def synth_root() -> Path:
    """Where synthesis keeps answers, prompts and run journals."""
    return config.user_cache_dir() / DIR


def request_key(label: str, args: Mapping[str, Any], sample: int) -> str:
    """The sha256 naming one exact request (model, every argument of the SDK call, the sample)."""
    doc = {"format": FORMAT, "model": label, "request": args, "sample": sample}
    return hashlib.sha256(json.dumps(doc, sort_keys=True, ensure_ascii=False, default=str).encode()).hexdigest()


class AnswerCache:
    """The answers (and the prompt) of one module call: `synth/<backend>/<entry key>/`."""

    def __init__(self, backend: str, entry_key: str, root: Path | None = None) -> None:
        self.dir = (root or synth_root()) / backend / entry_key

    def _path(self, key: str) -> Path:
        return self.dir / f"{key}.json"

    def _read(self, path: Path) -> dict[str, Any] | None:
        try:
            doc = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.warning("metal_accel: ignoring stored answer %s: %s", path.name, exc)
            return None
        return doc if isinstance(doc, dict) and doc.get("format") == FORMAT else None

    def _write(self, path: Path, doc: Mapping[str, Any]) -> None:
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            atomic_write(path, scrub(json.dumps(doc, indent=1, ensure_ascii=False)))
        except OSError as exc:  # keeping answers is a saving, never a reason to fail the run
            log.warning("metal_accel: could not store an answer in %s: %s", self.dir, exc)

    def get(self, key: str) -> tuple[Completion, dict[str, Any]] | None:
        """The stored answer to request `key` and its file's document, or None."""
        doc = self._read(self._path(key))
        if doc is None or not isinstance(doc.get("answer"), dict):
            return None
        a = doc["answer"]
        comp = Completion(str(a.get("text", "")), 0, 0, 0.0, finish=str(a.get("finish", "")),
                          reasoning_tokens=int(a.get("reasoning_tokens", 0)),
                          output_limit=int(a.get("output_limit", 0)))
        return comp, doc

    def put(self, key: str, label: str, tag: str, args: Mapping[str, Any], comp: Completion, cost_usd: float) -> None:
        """Store an answer with its whole request (the transcript so far)."""
        self._write(self._path(key), {
            "format": FORMAT, "model": label, "tag": tag, "created": time.time(), "request": dict(args),
            "answer": {"text": comp.text, "finish": comp.finish, "tokens_in": comp.tokens_in,
                       "tokens_out": comp.tokens_out, "reasoning_tokens": comp.reasoning_tokens,
                       "output_limit": comp.output_limit, "estimated_tokens": comp.estimated_tokens,
                       "latency_s": round(comp.latency_s, 3), "cost_usd": round(cost_usd, 6)}})

    def note(self, key: str, **fields: Any) -> None:
        """Add what became of an answer (its outcome, the candidate's digest, the feedback sent back)."""
        path = self._path(key)
        doc = self._read(path)
        if doc is not None:
            doc.update(fields)
            self._write(path, doc)

    def transcripts(self) -> list[dict[str, Any]]:
        """Every stored answer of this module, oldest first."""
        docs = [d for p in sorted(self.dir.glob("*.json")) if p.name not in ("prompt.json", "signature.json")
                for d in [self._read(p)] if d is not None]
        return sorted(docs, key=lambda d: d.get("created", 0))

    def load_prompt(self, wants: Mapping[str, Any]) -> Prompt | None:
        """The prompt saved for this module with the same `wants` (language, context switches), or None."""
        doc = self._read(self.dir / "prompt.json")
        if doc is None or doc.get("version") != PROMPT_VERSION or doc.get("wants") != dict(wants):
            return None
        return Prompt(str(doc["system"]), str(doc["user"]))

    def save_signature(self, signature: str, ops: Mapping[str, int]) -> None:
        """What the module computes (facts.signature), so that a later module computing the same can find
        this one's kernel as a reference."""
        if signature:
            self._write(self.dir / "signature.json", {"format": FORMAT, "signature": signature, "ops": dict(ops)})

    def save_prompt(self, prompt: Prompt, wants: Mapping[str, Any]) -> None:
        self._write(self.dir / "prompt.json", {"format": FORMAT, "version": PROMPT_VERSION, "wants": dict(wants),
                                               "system": prompt.system, "user": prompt.user})


def stored_signature(backend: str, entry_key: str, root: Path | None = None) -> str:
    """The op signature saved when the module of `entry_key` was synthesized ('' if none)."""
    try:
        doc = json.loads(((root or synth_root()) / backend / entry_key / "signature.json").read_text())
    except (OSError, ValueError):
        return ""
    return str(doc.get("signature", "")) if isinstance(doc, dict) else ""


class RunJournal:
    """The problems one `metal-accel synth` invocation finished, so that the same command resumes."""

    def __init__(self, identity: Mapping[str, Any], root: Path | None = None) -> None:
        sha = hashlib.sha256(json.dumps(dict(identity), sort_keys=True, default=str).encode()).hexdigest()[:24]
        self.path = (root or synth_root()) / "runs" / f"{sha}.jsonl"

    def finished(self) -> dict[str, dict[str, Any]]:
        """problem name -> what its run recorded."""
        out: dict[str, dict[str, Any]] = {}
        try:
            lines = self.path.read_text().splitlines()
        except OSError:
            return out
        for line in lines:
            try:
                doc = json.loads(line)
            except ValueError:  # a line cut by a crash
                continue
            if isinstance(doc, dict) and "problem" in doc:
                out[str(doc["problem"])] = doc
        return out

    def add(self, problem: str, **fields: Any) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a") as f:
                f.write(json.dumps({"problem": problem, "t": time.time(), **fields}) + "\n")
        except OSError as exc:
            log.warning("metal_accel: could not record progress in %s: %s", self.path, exc)

    def reset(self) -> None:
        self.path.unlink(missing_ok=True)


