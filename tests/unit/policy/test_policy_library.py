"""The built-in library passes its own suites and loads as one policy set."""

from pathlib import Path

import pytest

from services.policy import PolicySet
from services.policy.suite import find_suites, run_suite

LIBRARY = Path(__file__).resolve().parents[3] / "policies" / "library"
SUITES = find_suites(LIBRARY)


def test_library_has_the_field_report_rules():
    names = {s.parent.name for s in SUITES}
    assert {"namespace-gpu-max", "k8srequiredlabels", "a100-approved-projects", "data-labelling-region",
            "budget-low-priority"} <= names  # fmt: skip


@pytest.mark.parametrize("suite", SUITES, ids=[s.parent.name for s in SUITES])
def test_library_suite_passes(suite):
    results = run_suite(suite)
    assert results and all(r.passed for r in results), [
        f"{r.id}: {r.detail}" for r in results if not r.passed
    ]


def test_library_loads_as_one_set():
    ps = PolicySet.load(LIBRARY)
    assert len(ps) == 5
