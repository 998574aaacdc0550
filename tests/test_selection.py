"""--skip/--only: whole step names or declared groups, no prefix matching, unknown words are bad
input with a suggestion; and every step's options are checked before anything is gathered, so a
bad inventory value is exit 2 with nothing done, through every front end (issue 25)."""

from __future__ import annotations

import json

import pytest
import yaml

from gpubox import areas
from gpubox.errors import GpuboxError
from gpubox.selection import select, words
from gpubox.simbox import build
from tests.clirun import gpubox

STEPS = ["host-devices", "container-config", "container", "cuda", "pcie-mrrs", "model-stage", "bench"]
GROUPS = {
    "lxc": ("host-devices", "container-config", "container", "cuda"),
    "stage": ("model-stage", "drafter-stage"),
}


def test_words_are_whole_names_or_groups():
    assert select(STEPS, GROUPS, only=["container"]) == ["container"]  # not container-config
    assert select(STEPS, GROUPS, skip=["container"]) == [s for s in STEPS if s != "container"]
    assert select(STEPS, GROUPS, only=["lxc"]) == STEPS[:4]
    assert select(STEPS, GROUPS, only=["stage,bench"]) == ["model-stage", "bench"]
    assert select(STEPS, GROUPS, only=["lxc"], skip=["cuda"]) == STEPS[:3]
    assert select(STEPS, GROUPS, only=["drafter-stage"]) == []  # declared, absent on this box
    assert select(STEPS, GROUPS) == STEPS
    assert words(["a, b", "", "c"]) == ["a", "b", "c"]


@pytest.mark.parametrize(
    "word, hint",
    [("container-cfg", "container-config"), ("mrrs", "pcie-mrrs"), ("stge", "stage"), ("nosuchstep", None)],
)
def test_an_unknown_word_is_bad_input_with_a_suggestion(word, hint):
    with pytest.raises(GpuboxError) as exc:
        select(STEPS, GROUPS, only=[word])
    msg = str(exc.value)
    assert f"unknown step or group {word!r}" in msg and "\n" not in msg
    if hint:
        assert f"did you mean {hint}" in msg
    else:
        assert "did you mean" not in msg


def test_every_group_names_real_steps_and_the_pipeline_is_one_list(tmp_path):
    """The registered groups name steps that the pipeline's modules give (on a box with a drafter)."""
    from gpubox.context import Context
    from gpubox.inventory import Inventory
    from gpubox.provision.recover import collect_steps

    sim = build(tmp_path / "box", [])
    inv = Inventory(sim.inventory_path)
    names = [s.name for s in collect_steps(Context(box=inv.box(sim.box), inventory=inv))]
    assert names == [
        "host-devices",
        "container-config",
        "container",
        "cuda",
        "pcie-mrrs",
        "pcie-link",
        "numa-balancing",
        "nccl-env",
        "pcie-acs",
        "driver-packages",
        "kernel-log",
        "model-stage",
        "drafter-stage",
        "docker-toolkit",
        "shm-room",
        "gpu-probe",
        "bench",
    ]
    members = {m for ms in areas.step_groups().values() for m in ms}
    assert members <= set(names)
    assert all(not hasattr(a, "providers") for a in areas.areas())


def test_only_container_runs_the_container_step_alone(tmp_path, capsys):
    sim = build(tmp_path / "box", ["container_stopped"])
    rc, out, err = gpubox(
        capsys, "-i", sim.inventory_path, "doctor", "ct200", "--only", "container", "--json"
    )
    assert [s["name"] for s in json.loads(out)["steps"]] == ["container"], out + err
    argv = ["doctor", "ct200", "--skip", "lxc,tune", "--skip", "nccl,probe,acs,diagnose", "--json"]
    rc, out, err = gpubox(capsys, "-i", sim.inventory_path, *argv)
    assert [s["name"] for s in json.loads(out)["steps"]] == ["model-stage", "drafter-stage", "bench"], (
        out + err
    )
    rc, out, err = gpubox(capsys, "-i", sim.inventory_path, "doctor", "ct200", "--only", "contianer")
    assert rc == 2 and "did you mean container" in err and len(err.strip().splitlines()) == 1


def _bad_profile(sim):
    """A value the inventory's schema accepts (a string) that only the nccl-env step can judge."""
    inv = yaml.safe_load(sim.inventory_path.read_text())
    inv["all"]["children"]["gpu_containers"]["hosts"]["ct200"]["gpubox_nccl_profile"] = "pcie-2numaa"
    sim.inventory_path.write_text(yaml.safe_dump(inv))


@pytest.mark.parametrize(
    "argv",
    [["doctor", "ct200"], ["recover", "ct200", "--yes", "--no-bench"], ["recover", "ct200", "--dry-run"]],
)
def test_a_bad_option_is_exit_2_before_anything_runs(argv, tmp_path, capsys):
    """gpubox_nccl_profile is read by one step late in the pipeline; its bad value stops the run
    before the first step gathers a fact (the container stays stopped, no call is made)."""
    sim = build(tmp_path / "box", ["container_stopped", "numa_balancing"])
    _bad_profile(sim)
    conf = sim.hpath("/etc/pve/lxc/200.conf").read_text()
    rc, out, err = gpubox(capsys, "-i", sim.inventory_path, *argv)
    assert rc == 2, out + err
    assert "unknown NCCL profile 'pcie-2numaa'" in err and len(err.strip().splitlines()) == 1
    assert sim.calls("pct") == [] and sim.hpath("/etc/pve/lxc/200.conf").read_text() == conf
    assert sim.read_state()["containers"]["200"]["status"] == "stopped"


def test_a_bad_option_stops_the_library_call_every_front_end_makes(tmp_path):
    """The Ansible module and the timer call doctor/recover/run_steps like the CLI: the same error."""
    from gpubox import hwtune
    from gpubox.context import Context
    from gpubox.inventory import Inventory
    from gpubox.pipeline import run_steps
    from gpubox.provision.recover import doctor

    sim = build(tmp_path / "box", [])
    _bad_profile(sim)
    inv = Inventory(sim.inventory_path)
    ctx = Context(box=inv.box("ct200"), inventory=inv, options={"persist": True})
    for call in (lambda: doctor(ctx), lambda: run_steps(ctx, hwtune.steps(ctx), "apply")):
        with pytest.raises(GpuboxError, match="unknown NCCL profile"):
            call()
