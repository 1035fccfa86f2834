"""Reasons safe to show and to send: environment values, home paths and credentials taken out of text.

A rejection reason is stored in the cache, printed by explain() and sent to an LLM as repair
feedback; it may quote a crash report, a compiler message or a traceback that saw this process's
environment. `redact` removes from such text:

- the value of every environment variable whose name says it is a credential (KEY, TOKEN, SECRET,
  PASSWORD, CREDENTIAL, AUTH, ...) -> [redacted];
- every other environment value of 12 characters or more found verbatim -> $NAME, except values of
  known-harmless variables (PATH, LANG, ...) and values that are only system directories;
- the user's home directory -> ~;
- credentials and key-shaped tokens, as metal_accel.core.scrub finds them (URL user:password@, sk-...);
- the values of `NAME=VALUE` pairs (and `'NAME': 'VALUE'`) that name an environment variable or a
  credential, and of every upper-case pair in text holding three or more of them (a dump of an
  environment, whose values this process may not know).
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from .scrub import REDACTED, scrub

SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE|SESSION|PRIVATE|SIGNATURE", re.I)
HARMLESS_NAMES = frozenset({"PATH", "LANG", "LANGUAGE", "PWD", "OLDPWD", "HOME", "SHELL", "TERM", "TERM_PROGRAM",
                            "COLORTERM", "SHLVL", "TZ", "_", "TMPDIR", "PYTHONHASHSEED", "MANPATH", "INFOPATH",
                            "XDG_DATA_DIRS", "XDG_CONFIG_DIRS", "LD_LIBRARY_PATH", "PKG_CONFIG_PATH"})
MIN_VALUE = 12        # shorter values of ordinary variables are too common to mean anything (1, en_US, /tmp)
MIN_SECRET = 6        # credential-named variables: any value this long is removed
DUMP_PAIRS = 3        # this many upper-case NAME=VALUE pairs in one text make it an environment dump
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt", "/snap", "/nix",
               "/var/lib", "/System", "/Library", "/Applications", "C:\\Windows", "C:\\Program Files")

_PAIR = re.compile(r"(?<![\w\-$.])([A-Za-z_][A-Za-z0-9_]*)=(\"[^\"\n]*\"|'[^'\n]*'|" + re.escape(REDACTED)
                   + r"|[^\s,;'\"()\[\]{}]+)")
_QUOTED_PAIR = re.compile(r"(['\"])([A-Za-z_][A-Za-z0-9_]*)\1(\s*:\s*)(['\"])((?:(?!\4)[^\n])*)\4")
_UPPER = re.compile(r"[A-Z_][A-Z0-9_]*")


def _is_system_path(value: str, homes: list[str]) -> bool:
    """VALUE is one or more (os.pathsep-separated) paths, each inside a system directory, none in a home."""
    parts = [p for p in value.split(os.pathsep) if p]
    if not parts:
        return False
    for part in parts:
        if any(part == h or part.startswith(h.rstrip("/\\") + os.sep) for h in homes):
            return False
        if not any(part == d or part.startswith(d + "/") or part.startswith(d + "\\") for d in SYSTEM_DIRS):
            return False
    return True


def _plain(value: str) -> bool:
    """A value that identifies nothing: a number or a yes/no word."""
    v = value.strip().lower()
    return not any(c.isalpha() for c in v) and not any(c in v for c in "/\\@:") or \
        v in ("true", "false", "yes", "no", "on", "off", "none", "null")


def _homes() -> list[str]:
    homes = {os.path.expanduser("~")}
    try:
        homes.add(str(Path.home().resolve()))
    except (OSError, RuntimeError):
        pass
    return sorted((h for h in homes if h and len(h.rstrip("/\\")) > 1 and h != "~"), key=len, reverse=True)


def _env_values(homes: list[str]) -> list[tuple[str, str]]:
    """(value, replacement) for every environment value to remove, longest first."""
    out: dict[str, str] = {}
    for name, value in os.environ.items():
        if not value or _plain(value):
            continue
        if SECRET_NAME.search(name):
            if len(value) >= MIN_SECRET:
                out[value] = REDACTED
        elif name not in HARMLESS_NAMES and not name.startswith("LC_") and len(value) >= MIN_VALUE \
                and not _is_system_path(value, homes):
            out.setdefault(value, f"${name}")
    return sorted(out.items(), key=lambda kv: len(kv[0]), reverse=True)


def _secret_pair(name: str, dump: bool) -> bool:
    return name in os.environ or bool(SECRET_NAME.search(name)) or (dump and bool(_UPPER.fullmatch(name)))


def _pairs(text: str) -> str:
    """The values of environment-like NAME=VALUE and 'NAME': 'VALUE' pairs replaced by [redacted]."""
    names = [m.group(1) for m in _PAIR.finditer(text)] + [m.group(2) for m in _QUOTED_PAIR.finditer(text)]
    dump = sum(1 for n in names if _UPPER.fullmatch(n)) >= DUMP_PAIRS

    def plain(m: re.Match[str]) -> str:
        return f"{m.group(1)}={REDACTED}" if _secret_pair(m.group(1), dump) and m.group(2) != REDACTED \
            else m.group(0)

    def quoted(m: re.Match[str]) -> str:
        q, name, sep, vq = m.group(1), m.group(2), m.group(3), m.group(4)
        return f"{q}{name}{q}{sep}{vq}{REDACTED}{vq}" if _secret_pair(name, dump) else m.group(0)
    return _QUOTED_PAIR.sub(quoted, _PAIR.sub(plain, text))


class _Rules:
    """What to remove, read once from the environment for one text or one document."""

    def __init__(self) -> None:
        self.homes = _homes()
        self.values = _env_values(self.homes)
        self.home_patterns = [re.compile(re.escape(h.rstrip("/\\")) + r"(?![\w.\-])") for h in self.homes]

    def apply(self, text: str) -> str:
        out = text
        for value, replacement in self.values:
            if value in out:
                out = out.replace(value, replacement)
        for pattern in self.home_patterns:
            out = pattern.sub("~", out)
        return _pairs(scrub(out))


_last: tuple[tuple, _Rules] | None = None


def _rules() -> _Rules:
    """The rules for the environment as it is now: rebuilt only when a variable changed (building them reads
    every value; optimize() redacts each module's report, hundreds of times a model)."""
    global _last
    env = tuple(os.environ.items())
    if _last is None or _last[0] != env:
        _last = (env, _Rules())
    return _last[1]


def redact(text: str) -> str:
    """TEXT with environment values, the home directory, credentials and environment dumps taken out."""
    text = str(text)
    return _rules().apply(text) if text else text


def redact_obj(value: Any, rules: _Rules | None = None) -> Any:
    """VALUE with `redact` applied to every string inside it (dicts, lists and tuples are walked)."""
    if isinstance(value, str):
        return (rules or _rules()).apply(value) if value else value
    if isinstance(value, dict):
        rules = rules or _rules()
        return {k: redact_obj(v, rules) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        rules = rules or _rules()
        return type(value)(redact_obj(v, rules) for v in value)
    return value


__all__ = ["redact", "redact_obj"]
