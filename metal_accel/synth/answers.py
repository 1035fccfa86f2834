"""Reading an LLM's answer: the candidate block, whatever the fence spelling, line endings,
drafts, other-language blocks or thinking sections around it; truncated and empty answers named.

An answer may be spelled ```` ```Python ````, ```` ```python3 ````, ```` ``` python ````, ```` ```py ````,
```` ~~~ ```` or carry no language at all; its lines may end in CRLF; it may hold a ```` ```cpp ````
or ```` ```metal ```` block of the kernel alone, a draft and then a final version, or a
`<think>...</think>` section with drafts of its own. The candidate is the last closed block
that defines both SOURCE and forward, outside thinking sections. An answer with no such block
is one of: empty, thinking only, cut off by the output limit, or malformed; the first three are
reported as such (the model is never told "invalid Python" about an answer that was cut off).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..core.candidate import Candidate, parse_candidate
from ..core.errors import CandidateFormatError

# Tags reasoning models wrap their thinking in (DeepSeek-R1, Qwen3, QwQ, Kimi, and prompts asking for one).
_THINK_TAGS = ("think", "thinking", "reasoning", "reflection", "scratchpad")
_THINK = re.compile(r"<(" + "|".join(_THINK_TAGS) + r")\b[^>]*>.*?</\1\s*>", re.DOTALL | re.IGNORECASE)
_THINK_OPEN = re.compile(r"<(?:" + "|".join(_THINK_TAGS) + r")\b[^>]*>", re.IGNORECASE)
_THINK_CLOSE = re.compile(r"</(?:" + "|".join(_THINK_TAGS) + r")\s*>", re.IGNORECASE)
_KIMI = re.compile("\u25c1think\u25b7.*?\u25c1/think\u25b7", re.DOTALL)
_OPEN_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")
_SOURCE = re.compile(r"^SOURCE\s*(?::[^=]*)?=", re.MULTILINE)
_FORWARD = re.compile(r"^def\s+forward\s*\(", re.MULTILINE)

# Finish reasons meaning "the output limit was reached" (OpenAI and compatible servers; Anthropic).
TRUNCATED_FINISH = frozenset({"length", "max_tokens", "model_length"})


class AnswerProblem(CandidateFormatError):
    """An answer that holds no candidate. `kind`: 'empty', 'thinking-only', 'truncated' or 'malformed'."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class Block:
    info: str      # the fence's info string, lower-cased (e.g. "python", "cpp", "")
    code: str
    closed: bool


def normalize(text: str) -> str:
    """`text` with CRLF and CR line endings made LF."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def strip_thinking(text: str) -> tuple[str, bool]:
    """(`text` without thinking sections, whether a thinking section was left open).

    A closing tag with no opening one (servers that strip the opening tag) drops everything before
    it; an opening tag never closed drops everything after it.
    """
    out = _KIMI.sub("", _THINK.sub("", text))
    closes = list(_THINK_CLOSE.finditer(out))
    if closes:
        out = out[closes[-1].end():]
    opened = _THINK_OPEN.search(out)
    if opened:
        return out[: opened.start()], True
    return out, False


def fenced_blocks(text: str) -> list[Block]:
    """The fenced code blocks of a Markdown text, in order; the last may be unclosed (cut off).

    A block closes at a line holding only a fence of its character at least as long as its opening,
    or (a common slip) at a line ending in its fence: ```` return out``` ````.
    """
    blocks: list[Block] = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        m = _OPEN_FENCE.match(lines[i])
        if not m or (m.group(1)[0] == "`" and "`" in m.group(2)):
            i += 1
            continue
        fence, info = m.group(1), m.group(2).strip().lower()
        body: list[str] = []
        closed = False
        i += 1
        while i < len(lines):
            line = lines[i]
            stripped = line.strip()
            if stripped and set(stripped) == {fence[0]} and len(stripped) >= len(fence):
                closed = True
                break
            if line.rstrip().endswith(fence) and line.strip() != fence and not _OPEN_FENCE.match(line):
                body.append(line.rstrip()[: -len(fence)])
                closed = True
                break
            body.append(line)
            i += 1
        blocks.append(Block(info, "\n".join(body).strip("\n") + "\n", closed))
        i += 1
    return blocks


def defines_candidate(code: str) -> bool:
    """Whether `code` defines SOURCE and forward at top level (textually: a syntax error still counts,
    so that a final answer with a typo is reported, not passed over for an earlier draft)."""
    return bool(_SOURCE.search(code) and _FORWARD.search(code))


def candidate_code(text: str, *, truncated: bool = False) -> str:
    """The code of the candidate in answer `text`; raise AnswerProblem saying why there is none.

    `truncated`: the server said the answer hit its output limit.
    """
    text = normalize(text)
    if not text.strip():
        raise AnswerProblem("truncated" if truncated else "empty",
                            "the answer was cut off before any text" if truncated else "the answer was empty")
    visible, open_thinking = strip_thinking(text)
    blocks = fenced_blocks(visible)
    for block in reversed(blocks):
        if block.closed and defines_candidate(block.code):
            return block.code
    if truncated or open_thinking or (blocks and not blocks[-1].closed):
        if not visible.strip():
            raise AnswerProblem("truncated" if truncated else "thinking-only",
                                "the answer was cut off while thinking, before any code" if truncated
                                else "the answer held only a thinking section, no code")
        raise AnswerProblem("truncated", "the answer was cut off before its code block was complete")
    if not visible.strip():
        raise AnswerProblem("thinking-only", "the answer held only a thinking section, no code")
    if not blocks:
        if defines_candidate(visible):  # bare code, no fences
            return visible.strip("\n") + "\n"
        raise AnswerProblem("malformed", "no code block defining SOURCE and forward()")
    langs = sorted({b.info.split()[0] if b.info else "(no language)" for b in blocks})
    raise AnswerProblem("malformed", f"no code block defines both SOURCE and forward() (blocks found: {', '.join(langs)})")


def read_answer(text: str, backend: str, origin: str = "", *, truncated: bool = False) -> Candidate:
    """The candidate in answer `text`; raise AnswerProblem (or CandidateFormatError for a block that
    is not a valid candidate, e.g. a syntax error)."""
    return parse_candidate(candidate_code(text, truncated=truncated), backend, origin=origin)
