"""Candidate files written by a generator (benchmarks/candidates/gen_*.py) equal its output."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

CANDIDATES = Path(__file__).resolve().parent.parent / "benchmarks" / "candidates"
GENERATORS = sorted(CANDIDATES.glob("gen_*.py"))


def test_there_are_generators_for_both_gpu_and_cpu():
    assert any(g.stem.startswith("gen_cuda_") for g in GENERATORS)
    assert any(g.stem.startswith("gen_cpu_") for g in GENERATORS)


@pytest.mark.parametrize("generator", GENERATORS, ids=lambda p: p.stem)
def test_generated_candidates_match_their_generator(generator: Path, tmp_path: Path):
    """A generated candidate edited by hand (or a generator changed without re-running it) fails here."""
    spec = importlib.util.spec_from_file_location(generator.stem, generator)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    committed_dir = Path(module.OUT)  # the backend folder the generator writes to, e.g. candidates/cuda
    module.OUT = tmp_path
    module.main()
    written = sorted(tmp_path.glob("*.py"))
    assert written, f"{generator.name} wrote nothing"
    for path in written:
        committed = committed_dir / path.name
        assert committed.read_text() == path.read_text(), f"{committed.name} differs from {generator.name}'s output"
