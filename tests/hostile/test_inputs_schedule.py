"""Schedule inputs are validated before anything is written: a calendar spec that is an option
(`--help`), spans that overflow, digits that are not ASCII; and the run-once child imports gpubox,
never a `gpubox/` folder in the directory it was started from."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest

from gpubox.bench import schedule
from gpubox.bench.runonce import CHILD_BOOT
from gpubox.errors import GpuboxError


def _box(**sched):
    return SimpleNamespace(name="ct1", vmid=200, var=lambda k, d=None: sched if k == "gpubox_schedule" else d)


@pytest.mark.parametrize(
    "spec",
    [
        "--help",
        "-h",
        "--version",
        "daily --help",
        "a b c d e",
        "",
        "daily\n",
        "*-*-* 00:00:00%n",
        "$(x)",
        "é",
    ],
)
def test_bad_calendar_specs_are_refused_before_writing(spec):
    if spec:  # an empty spec is "not given" there (the default --every applies)
        with pytest.raises(GpuboxError, match="not a calendar spec"):
            schedule.spec_from(_box(), on_calendar=spec)
    with pytest.raises(GpuboxError):
        schedule.check_calendar(spec)


@pytest.mark.parametrize("spec", ["daily", "*-*-* 00/6:00:00", "Mon..Fri 03:00", "weekly"])
def test_good_calendar_specs_pass(spec):
    assert schedule.spec_from(_box(), on_calendar=spec).on_calendar == spec
    assert schedule.check_calendar(spec) == spec


@pytest.mark.parametrize(
    "field, value",
    [
        ("every", "99999999999999999999d"),
        ("every", "400d"),
        ("every", "\u0663h"),  # ARABIC-INDIC DIGIT THREE: int() reads it, systemd does not
        ("timeout", "9999999999999h"),
        ("timeout", "367d"),
        ("timeout", "0"),
    ],
)
def test_spans_that_overflow_or_are_not_ascii_are_refused(field, value):
    with pytest.raises(GpuboxError, match="time span|longer than"):
        schedule.spec_from(_box(), **{field: value})


def test_a_year_is_still_a_span():
    assert schedule.spec_from(_box(), every="365d", timeout="2h").every == 365 * 86400


def test_run_once_child_ignores_a_gpubox_folder_in_its_working_directory(tmp_path):
    fake = tmp_path / "gpubox"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise SystemExit('DAMAGE: the cwd gpubox was imported')\n")
    plain = subprocess.run(
        [sys.executable, "-m", "gpubox.cli", "--version"], cwd=tmp_path, capture_output=True, text=True
    )
    assert "DAMAGE" in plain.stderr  # what `-m` does: the reason for the boot
    r = subprocess.run(
        [sys.executable, "-c", CHILD_BOOT, "--version"], cwd=tmp_path, capture_output=True, text=True
    )
    assert r.returncode == 0 and "DAMAGE" not in r.stderr and "version" in r.stdout
