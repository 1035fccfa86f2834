"""docs/benchmarks.md is what `python -m benchmarks.render` makes of the committed results tree, and every
results file says how, where and when it was measured."""
from __future__ import annotations

import json

from benchmarks import render
from benchmarks.results import RESULTS, missing_fields


def test_committed_doc_is_the_rendering_of_the_committed_results():
    assert render.DOC.read_text() == render.render(), "run: python -m benchmarks.render"


def test_every_results_file_has_command_machine_and_date():
    files = sorted(RESULTS.glob("*/*.json"))
    assert files
    bad = {str(p.relative_to(RESULTS)): missing_fields(json.loads(p.read_text())) for p in files}
    assert not {k: v for k, v in bad.items() if v}


def test_results_tree_holds_only_runs_and_their_plots():
    stray = [p for p in RESULTS.rglob("*") if p.is_file() and p.suffix not in (".json", ".png")]
    nested = [p for p in RESULTS.rglob("*") if p.is_file() and len(p.relative_to(RESULTS).parts) != 2]
    assert not stray and not nested


def test_plots_named_by_runs_exist():
    for p in RESULTS.glob("*/*.json"):
        plot = json.loads(p.read_text()).get("plot")
        assert plot is None or (p.parent / plot).is_file(), p


def test_rendering_is_deterministic():
    assert render.render() == render.render()
