"""Build the kernel bundle this example app ships: optimize the model, export what was accepted.

    python examples/bundle_app/make_bundle.py [--candidates DIR]

Writes examples/bundle_app/kernels/ (the bundle) and examples/bundle_app/kernels.lock (its pin).
Run it on the kind of device the app will run on: verdicts are per device, and a kernel proven
elsewhere is proven again, once, on the user's device before it runs there.
"""
from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--candidates", help="a directory of candidate kernels (default: the shipped cache only)")
    args = parser.parse_args()
    os.environ["METAL_ACCEL_USER_CACHE"] = tempfile.mkdtemp(prefix="bundle_build_")  # start from nothing
    import metal_accel
    from metal_accel.store import cache as cache_mod
    from metal_accel.store.bundle import export_bundle
    from metal_accel.demo import build_demo_model, demo_inputs

    model = build_demo_model().eval()
    (ids,) = demo_inputs()
    metal_accel.optimize(model, (ids,), providers=[f"dir:{args.candidates}"] if args.candidates else [])
    print(metal_accel.explain(model))
    shutil.rmtree(HERE / "kernels", ignore_errors=True)
    # the proofs made on this machine are in the (temporary) user cache; the shipped entries they
    # came from are read-only, so export from both
    info = export_bundle(HERE / "kernels", cache_mod.all_caches(), classes=["metal_accel.demo.*"])
    (HERE / "kernels.lock").write_text(info.lock + "\n")
    print(f"bundle: {info.path} ({info.entries} entries); lock {info.lock}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
