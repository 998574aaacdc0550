"""Oracle: plant a link everywhere gpubox writes (issue 37, "writes follow planted links").

For each front-end command on a simulated box: run it once under the audit hook
(tests/hostile/linkoracle.py) to record every path gpubox's process writes; then, for every
recorded path and each of its parent directories beneath the box's roots and the state directory
(sampled per kind, deterministically; GPUBOX_ORACLE_FULL=1 tries every one), re-run on a fresh copy
of the box with that name replaced by a symbolic link to a victim file or directory. The victim
must never change (its content, mode, owner, mtime, and nothing new beside it or inside it), and
the run must end cleanly: exit 0/1, or exit 2 with one line, never a traceback.

    .venv/bin/python -m pytest -q -m oracle tests/hostile        # both oracles
    GPUBOX_ORACLE_FULL=1 ...                                     # every path, not a sample

`stage` is the local copier (`gpubox stage SRC DEST` inside the container's root): its lock,
journal, partials, manifest and staged files are planted like every other path; `recover` stages
through the payload runner in a child process, which the hook does not see.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.clirun import gpubox
from tests.hostile import linkoracle as lo

pytestmark = [pytest.mark.oracle, pytest.mark.timeout(900)]

FIX = Path(__file__).parent.parent / "fixtures" / "history"
EXPECT = {
    "tolerance": 0.10,
    "tok_s": {
        "tp1": {"auto": 26.6, "ddtree:15": 173.4},
        "tp4": {"auto": 37.8, "ddtree:15": 281.1},
        "tp8": {"auto": 37.6, "ddtree:15": 263.9},
    },
}


class BenchBox(lo.Box):
    """A box set up as a scheduled one is: gpubox and its inventory inside the container."""

    def extra(self) -> None:
        extra = self.sim.inventory_extra["container"]
        extra["gpubox_bench"] = {
            "expect": EXPECT,
            "regress": {"window": 5, "tolerance": 0.10, "sustained": 3},
        }
        self.sim.write_inventory()
        exe = self.sim.cpath("/usr/local/bin/gpubox")
        exe.parent.mkdir(parents=True, exist_ok=True)
        exe.write_text("#!/bin/sh\nexit 0\n")
        exe.chmod(0o755)
        shutil.copy(self.sim.inventory_path, self.sim.cpath("/etc/gpubox/inventory.yml"))


# name: (faults, argv after `-i INVENTORY`, links planted per kind in a sampled run, kinds the
# unplanted run must have written: the oracle is only as good as what it recorded)
# `stage SRC DEST` is given its paths: it is planted beneath the destination's parent and the
# state directory (ANCHORS), what is above them being the user's choice.
ANCHORS = {"stage": ["{ct}/dev/shm", "{state}"]}
COMMANDS = {
    "recover": (
        ("seed",),
        ["recover", "ct200", "--yes", "--no-bench"],
        1,
        {"host:boot", "host:config", "host:lock", "host:unit", "ct:nccl", "state:backups"},
    ),
    "lxc-fix": (("uvm_stale_major", "uvm_missing"), ["lxc", "fix", "ct200", "--yes"], 1, {"host:boot"}),
    "tune": (("mrrs_512", "numa_balancing"), ["tune", "pcie", "ct200", "--persist"], 1, {"host:unit"}),
    "schedule-install": ((), ["schedule", "install", "ct200", "--every", "6h"], 1, {"ct:unit"}),
    "stage": (
        ("shm_empty",),
        ["stage", "{ct}/mnt/models/Qwen3.6-27B-sim", "{ct}/dev/shm/Qwen3.6-27B-sim"],
        1,
        {
            "ct:staging-lock",
            "ct:staging-journal",
            "ct:staging-manifest",
            "ct:staging-partial",
            "ct:staging-file",
        },
    ),
    "schedule-run-once": (
        (),
        ["schedule", "run-once", "ct200", "--no-doctor", "--from-json", str(FIX / "run01.json"), "--json"],
        1,
        {"ct:prom", "state:history"},
    ),
}


def _run(capsys, box: lo.Box, argv: list[str]) -> tuple[int, str, str]:
    argv = [a.replace("{ct}", str(box.roots["ct"])) for a in argv]
    return gpubox(capsys, "-i", box.sim.inventory_path, *argv)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_a_link_planted_at_any_path_gpubox_writes_never_reaches_its_target(
    name, tmp_path, capsys, monkeypatch
):
    faults, argv, per_kind, must = COMMANDS[name]
    box = BenchBox(tmp_path / "b", faults)
    monkeypatch.setenv("GPUBOX_STATE_DIR", str(box.state))
    monkeypatch.setenv("GPUBOX_LOCK_WAIT", "0")
    rec = lo.Recorder.get()

    box.reset()
    rec.start()
    try:
        rc, out, err = _run(capsys, box, argv)
    finally:
        rec.stop()
    assert lo.clean_outcome(rc, err) is None and rc in (0, 1), f"the unplanted run failed: {rc} {err}"
    written = {p for p in rec.written if lo.kind(box, p) != "outside"}
    is_dir = {p for p in written if os.path.isdir(p) and not os.path.islink(p)}
    anchors = [a.format(ct=box.roots["ct"], state=box.state) for a in ANCHORS.get(name, [])] or None
    plants = lo.plan_plants(box, written, per_kind, anchors=anchors)
    seen = {lo.kind(box, p) for p in written}
    assert must <= seen, (
        f"{name}: the unplanted run wrote none of {sorted(must - seen)} (seen: {sorted(seen)})"
    )

    victims = lo.Victims(tmp_path)
    changed, unclean = [], []
    for k, path in plants:
        box.reset()
        was_dir = path in is_dir or any(w.startswith(path + "/") for w in written)
        lo.plant(path, victims, was_dir)
        rc, out, err = _run(capsys, box, argv)
        diff = victims.changed()
        if diff:
            changed.append(f"DAMAGE: {k} {path} -> victim changed: {diff}")
            victims = lo.Victims(tmp_path / f"v{len(changed)}")
        why = lo.clean_outcome(rc, err)
        if why:
            unclean.append(f"{k} {path}: {why}")
    kinds = sorted({k for k, _ in plants})
    figures = {
        "command": name,
        "paths_recorded": len(written),
        "links_planted": len(plants),
        "kinds": kinds,
        "victims_changed": len(changed),
        "unclean": len(unclean),
        "full": lo.FULL,
    }
    report = os.environ.get("GPUBOX_ORACLE_REPORT")
    if report:
        with open(report, "a") as f:
            f.write(json.dumps(figures) + "\n")
    print(json.dumps(figures))
    assert not changed, "\n".join(changed)
    assert not unclean, "\n".join(unclean)
