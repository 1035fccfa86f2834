"""Small modules with known eager behaviour, and candidate kernels for them, used across tests."""
import torch
from torch import nn


class Chain(nn.Module):
    """Three rounds of a dozen elementwise ops: eager pays a dispatch per op, a fused kernel pays
    one, so a correct kernel wins by several times and speed-gate tests do not depend on noise."""

    def __init__(self, n: int = 256) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, n))
        self.shift = 0.125
        self.rounds = 3

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.rounds):
            y = x * self.scale
            y = y + self.shift
            y = torch.relu(y)
            y = y * 0.5
            y = y - x
            y = y * y
            y = y + 1.0
            y = torch.sqrt(y)
            y = y * x
            y = y - 0.25
            y = torch.abs(y)
            x = y + x
        return x


class Net(nn.Module):
    def __init__(self, n: int = 256) -> None:
        super().__init__()
        self.chain = Chain(n)
        self.proj = nn.Linear(n, n)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.chain(x))


_CHAIN_BODY = """
      float v = x[r * n + i];
      for (int round = 0; round < 3; ++round) {
        float y = v * s[i] + shift;
        y = y > 0.0f ? y : 0.0f;
        y = y * 0.5f - v;
        y = std::sqrt(y * y + 1.0f) * v - 0.25f;
        v = std::fabs(y) + v;
      }
      out[r * n + i] = v;"""

CHAIN_HOST = '''
def forward(module, x):
    out = torch.empty_like(x)
    n = x.shape[-1]
    lib.chain(x.contiguous(), module.scale, out, x.numel() // n, n, module.shift)
    return out
'''


def chain_candidate(body: str = _CHAIN_BODY, extra: str = "") -> str:
    """A Chain candidate whose per-element body is `body`."""
    return ('SOURCE = r"""\n#include <cstdint>\n#include <cmath>\n'
            'extern "C" void chain(const float* x, const float* s, float* out, int64_t rows, int64_t n, float shift) {\n'
            f'  for (int64_t r = 0; r < rows; ++r) {{\n{extra}'
            '    _Pragma("omp simd") for (int64_t i = 0; i < n; ++i) {' + body + "\n    }\n  }\n}\n\"\"\"\n" + CHAIN_HOST)


GOOD = chain_candidate()
WRONG = chain_candidate(_CHAIN_BODY.replace("+ v;", "+ 1.001f * v;"))
UNWRITTEN_TAIL = chain_candidate(_CHAIN_BODY.replace("out[r * n + i] =", "if (i + 1 < n) out[r * n + i] ="))
SLOW = chain_candidate(extra="    for (volatile int spin = 0; spin < 200000; ++spin) {}\n")
NO_COMPILE = chain_candidate(_CHAIN_BODY.replace("float v", "flot v"))
RAISES = GOOD.replace("lib.chain(x.contiguous(), module.scale, out, x.numel() // n, n, module.shift)",
                      "lib.chain(x.contiguous(), module.scale, out, x.numel() // n, n)")
SANDBOX_ESCAPE = GOOD.replace("out = torch.empty_like(x)", "out = torch.load('weights.pt')")
SEGFAULT = chain_candidate(extra="    if (rows > 0) { volatile float* p = nullptr; p[r] = 1.0f; }\n")
TRAP = chain_candidate(extra="    if (rows > 0) __builtin_trap();\n")
HANG = chain_candidate(extra="    for (volatile int spin = 0; spin >= 0; spin = spin + 1 - 1) {}\n")
RUNAWAY_ALLOC = chain_candidate(extra="    { std::vector<float> grow(1); for (;;) grow.resize(grow.size() * 2); }\n"
                                ).replace("#include <cmath>", "#include <cmath>\n#include <vector>")
