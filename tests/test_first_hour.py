"""A newcomer's first commands (issue 29, point 8): inputs checked against the box, did-you-mean
for commands, and a demo that leaves a faulty box to practise on."""

from __future__ import annotations

import json

import pytest

from gpubox.simbox import build
from tests.clirun import gpubox


@pytest.fixture()
def sim(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUBOX_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("COLUMNS", "300")
    return build(tmp_path / "box", [], gpus=8)


@pytest.mark.parametrize("tp,msg", [("3", "TP 3 does not divide the 8 GPUs"), ("16", "TP 16 needs 16 GPUs")])
def test_bench_tp_checked_against_the_box(sim, capsys, tp, msg):
    rc, out, err = gpubox(capsys, "-i", sim.inventory_path, "bench", "ct200", "--tp", tp)
    assert rc == 2 and msg in err and "1, 2, 4, 8" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "typo,want", [("docter", "'doctor'"), ("recovr", "'recover'"), ("shedule", "'schedule'")]
)
def test_did_you_mean_for_commands(capsys, typo, want):
    rc, out, err = gpubox(capsys, typo, "ct200")
    assert rc == 2 and f"No such command '{typo}'" in err and "Did you mean" in err and want in err


def test_unknown_command_without_a_close_one_names_no_guess(capsys):
    rc, out, err = gpubox(capsys, "xyzzy")
    assert rc == 2 and "No such command 'xyzzy'" in err and "Did you mean" not in err


def test_demo_keep_leaves_a_faulty_box_to_practise_on(tmp_path, capsys, monkeypatch):
    keep = tmp_path / "demo"
    rc, out, err = gpubox(capsys, "demo", "--keep", keep, "--no-bench", "--json")
    doc = json.loads(out)
    assert rc == 0 and doc["doctor_after_ok"] is True
    practice = doc["practice_inventory"]
    assert practice and practice.startswith(str(keep))
    # the practice box still has the seed's faults: a dry run there has a plan to show
    monkeypatch.setenv("GPUBOX_STATE_DIR", str(tmp_path / "practice-state"))
    rc, out, err = gpubox(capsys, "-i", practice, "recover", "ct200", "--dry-run", "--no-bench", "--json")
    steps = {s["name"]: s for s in json.loads(out)["steps"]}
    assert rc == 1 and steps["container-config"]["status"] == "drift"
    assert "c 508:* rwm" in steps["container-config"]["diff"]


def test_demo_without_keep_prints_the_command_that_makes_one(capsys):
    from gpubox.provision.commands.demo import practice_lines

    (line,) = practice_lines(None, ["uvm_missing", "mrrs_512"])
    assert "gpubox sim create /tmp/gpubox-practice --fault uvm_missing --fault mrrs_512" in line
    assert "recover ct200 --dry-run" in line
