"""Tokens of a preprocessed MSL source, with bracket matching, for the MSL emulator's translator.

`Tokens` keeps every token (whitespace and comments included, so `render()` gives the source back
after in-place edits) and indexes the significant ones: `t(p)` is the text of significant token p,
`match` pairs brackets, `parent` names the innermost enclosing bracket, and the `attr_*` helpers
read `[[...]]` attributes.
"""
from __future__ import annotations

import re

from ...core.errors import CompileError

_TOKEN = re.compile(r"""
 (?P<nl>\n)|(?P<ws>[ \t\r\f\v]+|\\\n)|(?P<comment>//[^\n]*|/\*.*?\*/)
|(?P<str>"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*')
|(?P<num>0[xX][0-9a-fA-F']*(?:\.[0-9a-fA-F']*)?(?:[pP][+-]?\d+)?\w*|(?:\d[\d']*\.?[\d']*|\.\d[\d']*)(?:[eE][+-]?\d+)?\w*)
|(?P<id>[A-Za-z_]\w*)
|(?P<punct>::|->|\.\.\.|<<=|>>=|<=|>=|==|!=|&&|\|\||\+\+|--|[-+*/%&|^<>!=]=|<<|>>|[^\s\w])""", re.VERBOSE | re.DOTALL)


class Tokens:
    def __init__(self, text: str) -> None:
        self.kind: list[str] = []
        self.text: list[str] = []
        pos, line_start = 0, True
        while pos < len(text):
            if line_start and text[pos] == "#":  # a preprocessor line (line markers, #pragma)
                end = pos
                while True:
                    end = text.find("\n", end)
                    if end < 0:
                        end = len(text)
                        break
                    if text[end - 1] != "\\":
                        break
                    end += 1
                self.kind.append("pp"); self.text.append(text[pos:end]); pos = end
                continue
            m = _TOKEN.match(text, pos)
            assert m is not None
            kind = m.lastgroup or "punct"
            self.kind.append(kind); self.text.append(m.group(0))
            line_start = kind == "nl" or (line_start and kind == "ws")
            pos = m.end()
        self.sig = [i for i, k in enumerate(self.kind) if k not in ("nl", "ws", "comment", "pp")]
        self.match: dict[int, int] = {}  # sig position -> matching bracket's sig position
        self.parent: list[str] = []       # innermost enclosing bracket of each sig position
        self.opener: list[int] = []       # its sig position (-1 at file scope)
        stack: list[int] = []
        for p, i in enumerate(self.sig):
            t = self.text[i]
            self.parent.append(self.text[self.sig[stack[-1]]] if stack else "")
            self.opener.append(stack[-1] if stack else -1)
            if t in "([{" and self.kind[i] == "punct":
                stack.append(p)
            elif t in ")]}" and self.kind[i] == "punct":
                if not stack or "([{"[")]}".index(t)] != self.text[self.sig[stack[-1]]]:
                    raise CompileError(f"unbalanced {t!r} in kernel source")
                q = stack.pop()
                self.match[q], self.match[p] = p, q
        if stack:
            raise CompileError(f"unbalanced {self.text[self.sig[stack[-1]]]!r} in kernel source")

    def t(self, p: int) -> str:
        return self.text[self.sig[p]] if 0 <= p < len(self.sig) else ""

    def set(self, p: int, value: str) -> None:
        self.text[self.sig[p]] = value

    def is_attr_open(self, p: int) -> bool:
        return self.t(p) == "[" and self.t(p + 1) == "["

    def attr_end(self, p: int) -> int:
        """Sig position just after the `]]` closing the attribute opened at P."""
        return self.match[p] + 1

    def attr_items(self, p: int) -> list[tuple[str, str]]:
        """(name, argument text) of each attribute in the [[...]] at P."""
        inner = " ".join(self.t(q) for q in range(p + 2, self.match[p] - 1))
        items = []
        for m in re.finditer(r"([A-Za-z_][\w:]*)\s*(?:\(([^()]*)\))?", inner):
            items.append((m.group(1).split("::")[-1], (m.group(2) or "").strip()))
        return items

    def line(self, p: int) -> int:
        """Line of sig position P in the preprocessed text, or of the original source where line markers say."""
        line, i = 1, 0
        for i in range(self.sig[p] if 0 <= p < len(self.sig) else len(self.text)):
            k = self.kind[i]
            if k == "nl" or (k in ("ws", "comment") and "\n" in self.text[i]):
                line += self.text[i].count("\n")
            elif k == "pp":
                m = re.match(r"#\s*(?:line\s+)?(\d+)", self.text[i])
                if m:
                    line = int(m.group(1)) - 1
        return line

    def blank(self, lo: int, hi: int) -> None:
        """Remove sig positions LO..HI (inclusive) from the output."""
        for q in range(lo, hi + 1):
            self.set(q, "")

    def render(self) -> str:
        return "".join(self.text)
