"""Started exactly as the worker is (worker.launch), but after the worker's own preparation and confinement
it runs the attempts of test_adv_worker.py where a kernel would run, and sends their results as its one reply."""
from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path
from typing import Any, BinaryIO

from metal_accel.proof import worker_main as worker


def _attempts(proto_out: BinaryIO) -> None:
    targets = json.loads(os.environ["PROBE_TARGETS"])
    out: dict[str, Any] = {"environ": dict(os.environ)}

    def attempt(name: str, fn: Any) -> None:
        try:
            fn()
            out[name] = "allowed"
        except Exception as exc:
            out[name] = f"denied: {type(exc).__name__}: {exc}"
    attempt("write_user_cache", lambda: Path(targets["user_cache"], "worker_marker").write_text("1"))
    attempt("write_tmp", lambda: Path(targets["tmp"], "worker_marker").write_text("1"))
    attempt("read_build_dir", lambda: os.listdir(targets["build_dir"]))
    attempt("write_build_dir", lambda: Path(targets["build_dir"], "worker_marker").write_text("1"))
    attempt("connect", lambda: socket.create_connection(("127.0.0.1", targets["port"]), timeout=2).sendall(b"key"))
    attempt("spawn_sh", lambda: subprocess.run(["/bin/sh", "-c", f"touch {targets['tmp']}/sh_marker"], check=True))
    worker._hello(proto_out, {"probe": json.dumps(out)})


worker.serve = _attempts  # type: ignore[assignment]

if __name__ == "__main__":
    worker.main()
