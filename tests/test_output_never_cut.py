"""Output never loses text (issue 29, point 4): piped (no terminal, no COLUMNS) nothing is cut
with "…"; at a narrow width tables fold their cells; diffs wrap; every run ends with a recap."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from gpubox.simbox import build

ROOT = Path(__file__).resolve().parent.parent
FIX = ROOT / "tests" / "fixtures" / "results"


def _run(args, tmp_path, columns=None):
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env.update(GPUBOX_STATE_DIR=str(tmp_path / "state"), PYTHONPATH=str(ROOT))
    if columns:
        env["COLUMNS"] = str(columns)
    r = subprocess.run(
        [sys.executable, "-m", "gpubox.cli", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    return r.returncode, r.stdout, r.stderr


def test_recover_dry_run_piped_keeps_every_line_whole(tmp_path):
    sim = build(tmp_path / "box", ["uvm_missing", "numa_balancing", "mrrs_512"], gpus=2)
    rc, out, err = _run(["-i", sim.inventory_path, "recover", "ct200", "--dry-run", "--no-bench"], tmp_path)
    assert rc == 1
    # the udev rule and the sysctl.d comment, each on one line as written (no wrap, no cut)
    assert (
        '+ACTION=="add", SUBSYSTEM=="module", KERNEL=="nvidia_uvm", RUN+="/usr/bin/nvidia-modprobe -u -c0"'
        in out
    )
    assert "+# Managed by gpubox (hwtune numa): automatic NUMA page migration off for GPU serving." in out
    assert "…" not in out
    # progress lines (stderr) carry the whole detail: the persistence file names end as written
    assert "/etc/modules-load.d/nvidia-uvm.conf" in err.replace("\n", " ") and "…/etc" not in err
    # in a pipe each step is one result line (no start line the other lane's results fall between)
    lines = err.splitlines()
    assert not any(line.startswith("…") for line in lines)
    assert (
        sum(
            line.lstrip().startswith(("drift host-devices (pve1):", "fixed host-devices (pve1):"))
            for line in lines
        )
        == 1
    )
    assert out.rstrip().splitlines()[-1].startswith("ct200: problems remain")
    assert "recap: ok=" in out.rstrip().splitlines()[-1]


def test_narrow_tables_fold_instead_of_cutting():
    """The bench table at 50 columns: rich would cut each header and cell to "measu…"; folded,
    every character is still there (the first column, read down, spells the measurement key)."""
    import io

    from gpubox.bench.commands.bench import render
    from gpubox.output import OutputConsole

    doc = json.loads((FIX / "seed-after.json").read_text())
    buf = io.StringIO()
    render(doc, OutputConsole(file=buf, width=50, highlight=False))
    text = buf.getvalue()
    assert "…" not in text and "verdict:" in text
    first = "".join(
        line.split("│")[1].strip()
        for line in text.splitlines()
        if line.startswith("│") and line.count("│") > 2
    )
    for m in doc["measurements"]:
        assert m["key"] in first, m["key"]


def test_piped_output_never_splits_a_path_or_a_command(tmp_path):
    """To a file, a table wraps at spaces but a word longer than its cell (here an inventory path of
    over 200 characters inside a repair hint) is never split: the table grows to fit it."""
    deep = tmp_path / ("d" * 120) / ("e" * 100)
    sim = build(deep / "box", ["numa_balancing"], gpus=2)
    inv = str(sim.inventory_path)
    assert len(inv) > 200
    rc, out, err = _run(["-i", inv, "doctor", "ct200"], tmp_path)
    assert rc == 1, err
    assert any(inv in line for line in out.splitlines()), out[-3000:]
    short = [line for line in out.splitlines() if "numa_balancing" in line and inv not in line]
    assert all(len(line) <= len(inv) + 200 for line in short)  # the rest still wraps
