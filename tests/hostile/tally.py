"""Run the hostile suite and print the table per class: cases tried / clean / damaged.

    PYTHONPATH=$PWD python3 -m tests.hostile.tally            # this checkout's code
    PYTHONPATH=/path/to/other/checkout:$PWD python3 -m tests.hostile.tally   # e.g. main, for "before"
    python3 -m tests.hostile.tally tests/hostile/test_gate_hostile.py ...    # only these files

A case is clean when its test passes; damaged when it failed on an assertion marked DAMAGE
(a command ran, config space or a file outside gpubox's own changed, two changers overlapped)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    with tempfile.TemporaryDirectory() as d:
        xml = Path(d) / "r.xml"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                *([] if any(a.endswith(".py") for a in sys.argv[1:]) else [str(HERE)]),
                f"--junitxml={xml}",
                *sys.argv[1:],
            ],
            stdout=subprocess.DEVNULL,
        )
        root = ET.parse(xml).getroot()
    tried, clean, damaged = Counter(), Counter(), Counter()
    for tc in root.iter("testcase"):
        if tc.find("skipped") is not None:
            continue
        cls = tc.get("classname", "").split(".")[-1].removeprefix("test_").removesuffix("_hostile")
        tried[cls] += 1
        bad = tc.find("failure") if tc.find("failure") is not None else tc.find("error")
        if bad is None:
            clean[cls] += 1
        elif "DAMAGE" in (bad.get("message", "") + (bad.text or "")):
            damaged[cls] += 1
    print(f"{'class':<16}{'tried':>7}{'clean':>7}{'damaged':>9}")
    for cls in sorted(tried):
        print(f"{cls:<16}{tried[cls]:>7}{clean[cls]:>7}{damaged[cls]:>9}")
    print(f"{'total':<16}{sum(tried.values()):>7}{sum(clean.values()):>7}{sum(damaged.values()):>9}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
