"""Write metal_accel/library/classes.json: the module classes of the model zoo that compute a library family.

`import metal_accel` patches these classes (and those a user's optimize() found), so the library's kernels
reach them with no other change; whether a call really is the family is decided again, by tracing, at its
first call. Needs the bench extra (transformers, torchvision, timm):

    PYTHONPATH=. python scripts/library_classes.py [--models llama,gpt2,...]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.models import ZOO, build  # noqa: E402
from metal_accel.core.keys import class_path  # noqa: E402
from metal_accel.library.match import match_call  # noqa: E402

OUT = ROOT / "metal_accel" / "library" / "classes.json"


def calls_of(model: torch.nn.Module, args: tuple, kwargs: dict) -> dict[type, tuple]:
    """One call per module class: (module, args, kwargs) as the forward made it."""
    seen: dict[type, tuple] = {}
    handles = [m.register_forward_pre_hook(
        lambda mod, a, k: seen.setdefault(type(mod), (mod, a, k)) and None, with_kwargs=True)
        for m in model.modules()]
    try:
        with torch.inference_mode():
            model(*args, **kwargs)
    finally:
        for h in handles:
            h.remove()
    return seen


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(ZOO))
    a = p.parse_args()
    found: dict[str, str] = json.loads(OUT.read_text()) if OUT.is_file() else {}
    for name in a.models.split(","):
        built = build(name, "cpu", gpu=False)
        for cls, (module, args, kwargs) in calls_of(built.model, built.args, built.kwargs).items():
            m = match_call(module, args, kwargs)
            if m is not None and cls.__module__ != torch.nn.Sequential.__module__:  # a container's children decide
                found[class_path(cls)] = m.family
                print(f"{name}: {class_path(cls)} -> {m.family}")
    OUT.write_text(json.dumps(dict(sorted(found.items())), indent=1) + "\n")
    print(f"wrote {OUT} ({len(found)} classes)")


if __name__ == "__main__":
    main()
