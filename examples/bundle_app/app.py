"""An app that ships a kernel bundle and loads it, pinned to the bundle it was built with.

    python examples/bundle_app/app.py            # explicit: load_cache + optimize
    python examples/bundle_app/app.py --zero-code

--zero-code shows the other way: no optimize() call at all. The bundle is named by
METAL_ACCEL_CACHE_PATH before `import metal_accel`, which then patches the model classes the
bundle covers; each call with a cached shape runs its kernel (proven on this device first, once).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BUNDLE = HERE / "kernels"
LOCK = (HERE / "kernels.lock").read_text().strip()  # in a real app: a constant in the app's code


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--zero-code", action="store_true")
    args = parser.parse_args()
    if args.zero_code:
        os.environ["METAL_ACCEL_CACHE_PATH"] = str(BUNDLE)  # before the import: it is read at import time
    import torch

    import metal_accel
    from metal_accel.demo import build_demo_model, demo_inputs

    model = build_demo_model().eval()
    (ids,) = demo_inputs()
    if args.zero_code:
        # METAL_ACCEL_CACHE_PATH is a path the user named; pinning by hash needs load_cache(sha256=...)
        with torch.inference_mode():
            logits = model(ids)
        runs = sum(1 for m in model.modules() if getattr(m.__dict__.get("_metal_accel_auto"), "hits", 0))
        print(f"zero-code: {runs} modules ran bundled kernels; logits {tuple(logits.shape)}")
        return 0
    metal_accel.load_cache(BUNDLE, sha256=LOCK)  # refuses a bundle that is not the one we pinned
    metal_accel.optimize(model, (ids,))
    print(metal_accel.explain(model))
    with torch.inference_mode():
        logits = model(ids)
    print(f"logits {tuple(logits.shape)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
