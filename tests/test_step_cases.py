"""Every data-only step case under tests/steps/ (see tests/stepcases.py): facts in, decision out."""

import pytest

from tests.stepcases import ROOT, case_files, run_case

CASES = case_files()


@pytest.mark.parametrize("path", CASES, ids=[str(p.relative_to(ROOT)) for p in CASES])
def test_step_case(path):
    got, want = run_case(path)
    assert got == want


def test_there_are_cases():
    assert len(CASES) >= 4
