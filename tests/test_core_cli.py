"""The CLI's contract: exit 0 ok / 1 problems / 2 bad input, one-line errors without traceback
(-v shows it), lazy subcommands, and `gpubox sim create|faults` building a simulated box."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest

from gpubox import cli as cli_mod
from gpubox.clihelp import box_context, emit, json_option
from gpubox.host import connect_box
from gpubox.inventory import Inventory
from gpubox.pipeline import run_steps
from gpubox.steps import Action, Finding, Plan, Step

from .clirun import gpubox

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "inventory" / "example.yml"


def real_gpubox(*argv, env=None, timeout=120):
    """The installed console script (falls back to `python -m gpubox.cli`)."""
    exe = shutil.which("gpubox")
    cmd = [exe] if exe else [sys.executable, "-m", "gpubox.cli"]
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.run(
        [*cmd, *map(str, argv)], capture_output=True, text=True, timeout=timeout, env=e, cwd=ROOT
    )


# A subcommand registered only for these tests, through the same lazy COMMANDS table.
class _Numa(Step):
    name = "numa-balancing"

    def check(self, ctx):
        v = ctx.host.read_text("/proc/sys/kernel/numa_balancing").strip()
        return Finding.ok("0") if v == "0" else Finding.drift(f"numa_balancing={v}")

    def plan(self, ctx, f):
        return Plan("write 0", actions=[_WriteZero()])


class _WriteZero(Action):
    def describe(self, host):
        return [["sysctl", "-w", "kernel.numa_balancing=0"]]

    def execute(self, run):
        run.host().write("/proc/sys/kernel/numa_balancing", "0\n")


@click.command()
@click.argument("box")
@click.option("--apply", is_flag=True)
@click.option("--boom", is_flag=True)
@json_option
@click.pass_context
def tcheck(ctx, box, apply, boom, as_json):
    c = box_context(ctx, box, as_json=as_json)
    if boom:
        c.box.container.vars["__nope"]  # noqa: B018 - an internal error outside any step
    emit(run_steps(c, [_Numa()], "apply" if apply else "check"), as_json)


@pytest.fixture
def tcmd(monkeypatch):
    monkeypatch.setitem(cli_mod.COMMANDS, "tcheck", "tests.test_core_cli:tcheck")


@pytest.fixture
def simbox(tmp_path):
    from gpubox.simbox import build

    return build(tmp_path / "sim", ["numa_balancing"])


# ------------------------------------------------------------------------------ exit codes
def test_exit_1_when_problems_then_0_after_repair(tcmd, simbox, capsys):
    inv = str(simbox.inventory_path)
    rc, out, _ = gpubox(capsys, "-i", inv, "tcheck", "ct200", "--json")
    assert rc == 1 and json.loads(out)["steps"][0]["status"] == "drift"
    rc, out, _ = gpubox(capsys, "-i", inv, "tcheck", "ct200", "--apply", "--json")
    assert rc == 0 and json.loads(out)["steps"][0]["status"] == "fixed"
    assert simbox.hpath("/proc/sys/kernel/numa_balancing").read_text() == "0\n"
    rc, out, _ = gpubox(capsys, "-i", inv, "tcheck", "ct200")
    assert rc == 0 and "ct200: ok" in out


def test_exit_2_bad_input_one_line(tcmd, simbox, capsys):
    rc, out, err = gpubox(capsys, "-i", simbox.inventory_path, "tcheck", "ct404")
    assert rc == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("gpubox: error: unknown box 'ct404'") and "known boxes: ct200" in err


def test_internal_error_outside_steps_is_one_line_exit_2(tcmd, simbox, capsys):
    rc, out, err = gpubox(capsys, "-i", simbox.inventory_path, "tcheck", "ct200", "--boom")
    assert rc == 2 and out == "" and err.count("\n") == 1
    assert err == (
        "gpubox: internal error: KeyError: '__nope' (re-run with -v for the traceback and report it)\n"
    )
    rc, _, err = gpubox(capsys, "-vv", "-i", simbox.inventory_path, "tcheck", "ct200", "--boom")
    assert rc == 2 and "Traceback (most recent call last)" in err


def test_usage_errors_exit_2(capsys):
    rc, _, err = gpubox(capsys, "no-such-command")
    assert rc == 2 and "No such command" in err
    rc, _, err = gpubox(capsys, "-i", EXAMPLE, "inventory", "show")
    assert rc == 2 and "Missing argument" in err


def test_help_and_version(capsys):
    rc, out, _ = gpubox(capsys, "--help")
    assert rc == 0 and "inventory" in out and "sim" in out and "Exit status" in out
    rc, out, _ = gpubox(capsys, "--version")
    assert rc == 0 and "gpubox" in out


def test_lazy_registry_hides_missing_modules(monkeypatch, capsys):
    monkeypatch.setitem(cli_mod.COMMANDS, "ghost", "gpubox_no_such_module:ghost")
    rc, out, _ = gpubox(capsys, "--help")
    assert rc == 0 and "ghost" not in out
    rc, _, err = gpubox(capsys, "ghost")
    assert rc == 2 and "No such command 'ghost'" in err


def _registered() -> dict[str, str]:
    """The registered commands as they are in the tree, without the tests' own (`tcheck`)."""
    return {k: v for k, v in cli_mod.COMMANDS.items() if not v.startswith("tests.")}


def test_every_command_is_one_module_named_for_it_in_its_layers_commands_folder():
    """One way to add a command (docs/architecture.md): `gpubox/commands/<name>.py` for the core,
    `<area>/commands/<name>.py` for an area, defining the click command `<name>`; and every module
    in those folders is a registered command (no helpers hide there, nothing unregistered)."""
    from gpubox import areas

    layers = {"gpubox": ROOT / "gpubox" / "commands"}
    layers.update({a: ROOT / a.split(".")[1] / "commands" for a in areas.AREAS})
    wrong = []
    for name, target in _registered().items():
        mod, _, attr = target.partition(":")
        package, _, module = mod.rpartition(".")
        if package.removesuffix(".commands") not in layers or not package.endswith(".commands"):
            wrong.append(f"{name}: {target} is not in a layer's commands folder")
        elif module != name or attr != name:
            wrong.append(f"{name}: {target} is not <layer>.commands.{name}:{name}")
        else:
            cmd = getattr(importlib.import_module(mod), attr)
            if not isinstance(cmd, click.Command):
                wrong.append(f"{name}: {target} is not a click command")
    assert wrong == []
    on_disk = {
        f"{layer}.commands.{p.stem}"
        for layer, folder in layers.items()
        for p in folder.glob("*.py")
        if p.stem != "__init__"
    }
    assert on_disk == {t.partition(":")[0] for t in _registered().values()}
    # the core's own are registered in gpubox.cli, an area's only in its area.py
    assert {n for n, t in _registered().items() if t.startswith("gpubox.commands.")} == {"inventory", "sim"}
    assert set(areas.commands()) == set(_registered()) - {"inventory", "sim"}


# ------------------------------------------------------------------------------ the real script
def test_real_script_error_is_one_line_and_v_shows_traceback(tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text("all:\n  hosts:\n    pve1: {ansible_host: [1\n")
    r = real_gpubox("-i", bad, "inventory", "list")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert r.stderr.startswith(f"gpubox: error: malformed YAML at {bad}:")
    r = real_gpubox("-v", "-i", bad, "inventory", "list")
    assert r.returncode == 2 and "Traceback (most recent call last)" in r.stderr
    assert r.stderr.rstrip().splitlines()[-1].startswith("gpubox: error: malformed YAML")


def test_real_script_unreachable_host_names_it(sshd, tmp_path):
    """A box whose Proxmox host does not answer: exit 2, one line naming host and address."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    inv = tmp_path / "inv.yml"
    import yaml

    inv.write_text(
        yaml.safe_dump(
            {
                "all": {
                    "children": {
                        "proxmox_hosts": {
                            "hosts": {"pve1": sshd.vars(ansible_port=port, ansible_ssh_timeout=2)}
                        },
                        "gpu_containers": {
                            "hosts": {
                                "ct200": {
                                    "gpubox_vmid": 200,
                                    "gpubox_proxmox_host": "pve1",
                                    "gpubox_connection": "pct",
                                }
                            }
                        },
                    }
                }
            }
        )
    )
    code = (
        "import sys; from gpubox.cli import main; import tests.test_core_cli as t; "
        "from gpubox import cli; cli.COMMANDS['tcheck'] = 'tests.test_core_cli:tcheck'; main(sys.argv[1:])"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, "-i", str(inv), "tcheck", "ct200"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert r.returncode == 2, r.stderr
    assert (
        r.stderr == f"gpubox: error: pve1: cannot reach 127.0.0.1:{port}: Connection refused "
        "(check ansible_host/ansible_port and that sshd runs there)\n"
    )


# ------------------------------------------------------------------------------ sim
def test_sim_create_and_faults(tmp_path, capsys):
    rc, out, _ = gpubox(capsys, "sim", "faults", "--json")
    faults = json.loads(out)
    assert rc == 0 and {"numa_balancing", "lockdown"} <= set(faults)
    rc, out, _ = gpubox(capsys, "sim", "faults")
    assert rc == 0 and all(k in out for k in faults)
    dest = tmp_path / "box"
    rc, out, _ = gpubox(capsys, "sim", "create", dest, "--fault", "numa_balancing", "--json")
    doc = json.loads(out)
    assert rc == 0 and doc["faults"] == ["numa_balancing"] and Path(doc["inventory"]).is_file()
    inv = Inventory(doc["inventory"])
    box = inv.box("ct200")
    assert box.host.root == str(dest.resolve() / "pve1") and box.container.root == str(
        dest.resolve() / "ct200"
    )
    host, ct = connect_box(box)
    assert host.read_text("/proc/sys/kernel/numa_balancing") == "1\n"
    assert host.path("/etc/hostname").startswith(str(dest.resolve()))
    assert ct.read_text("/etc/hostname") == "ct200\n"
    # Stand-ins come first on the simulated hosts' PATH only, and record their calls.
    r = host.run(["systemctl", "daemon-reload"])
    assert r.rc == 0, r.stderr
    from gpubox.simbox import SimBox

    assert SimBox.load(dest).calls("systemctl")[-1]["argv"] == ["daemon-reload"]
    rc, out, _ = gpubox(capsys, "sim", "create", tmp_path / "human")
    assert rc == 0 and "simulated box in" in out and "faults: none" in out


def test_sim_create_bad_input(tmp_path, capsys):
    rc, _, err = gpubox(capsys, "sim", "create", tmp_path / "a", "--fault", "no_such_fault")
    assert rc == 2 and "unknown simulated fault(s): no_such_fault" in err and "numa_balancing" in err
    assert not (tmp_path / "a").exists() or not any((tmp_path / "a").iterdir())
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("mine")
    rc, _, err = gpubox(capsys, "sim", "create", full)
    assert rc == 2 and "is not empty" in err and (full / "x").read_text() == "mine"


def test_healthy_sim_is_seen_healthy_and_inventory_round_trips(tmp_path, capsys):
    from gpubox.simbox import build

    sim = build(tmp_path / "ok", [])
    assert sim.hpath("/proc/sys/kernel/numa_balancing").read_text() == "0\n"
    rc, out, _ = gpubox(capsys, "-i", sim.inventory_path, "inventory", "show", "ct200", "--json")
    doc = json.loads(out)
    assert rc == 0 and doc["container"]["vars"]["gpubox_root"] == str(sim.ct_root)
    assert doc["proxmox_host"]["vars"]["ansible_connection"] == "local"


def test_inventory_option_may_follow_the_subcommand(capsys):
    """`gpubox inventory list -i FILE` works like `gpubox -i FILE inventory list` (issue 2's spelling)."""
    from tests.clirun import gpubox

    inv = str(Path(__file__).resolve().parent.parent / "inventory" / "example.yml")
    a = gpubox(capsys, "inventory", "list", "-i", inv, "--json")
    b = gpubox(capsys, "-i", inv, "inventory", "list", "--json")
    assert a[0] == 0 and a[1] == b[1] and '"ct200"' in a[1]


def test_hoist_keeps_everything_after_double_dash():
    from gpubox.cli import hoist_global_options

    assert hoist_global_options(["doctor", "ct200", "-i", "x.yml", "-v"]) == [
        "-i",
        "x.yml",
        "-v",
        "doctor",
        "ct200",
    ]
    assert hoist_global_options(["stage", "--", "-i", "y"]) == ["stage", "--", "-i", "y"]
