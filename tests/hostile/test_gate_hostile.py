"""One input gate: the same bad box variable gives the same one-line error, naming the variable, from
the CLI, the Ansible module and a playbook (inventory value and extra-vars), run for real with
ansible-playbook; nothing is read from the box and nothing changes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpubox.cli import main

ROOT = Path(__file__).resolve().parents[2]
PLAYBOOKS = ROOT / "playbooks"

# (id, variable, value as YAML would carry it); None value = the variable is removed.
BAD = [
    ("vmid-true", "gpubox_vmid", True),
    ("vmid-shell", "gpubox_vmid", "200; reboot"),
    ("vmid-missing", "gpubox_vmid", None),
    ("vmid-list", "gpubox_vmid", [200]),
    ("vmid-float", "gpubox_vmid", 200.7),
    ("vmid-negative", "gpubox_vmid", -5),
    ("vmid-zero-padded-huge", "gpubox_vmid", 10**30),
    ("vmid-fullwidth", "gpubox_vmid", "２００"),
    ("env-list", "gpubox_env", ["A=1"]),
    ("env-nested", "gpubox_env", {"A": {"b": 1}}),
    ("gpus-word", "gpubox_gpus", "eight"),
    ("gpus-negative", "gpubox_gpus", -1),
    ("root-relative", "gpubox_root", "relative/dir"),
    ("bin-dirs-string-list", "gpubox_bin_dirs", [1, 2]),
]


def _playbook_bin() -> str | None:
    here = Path(sys.executable).parent / "ansible-playbook"
    return str(here) if here.exists() else shutil.which("ansible-playbook")


def _inventory(tmp_path: Path, boxes: dict[str, tuple[str, object]]) -> Path:
    """One Proxmox host (a private root prefix) and one box per bad value."""
    root = tmp_path / "pve1"
    root.mkdir(exist_ok=True)
    cts = {}
    for name, (var, value) in boxes.items():
        v = {
            "gpubox_vmid": 200,
            "gpubox_proxmox_host": "pve1",
            "gpubox_root": str(tmp_path / name),
            "ansible_connection": "local",
            "ansible_python_interpreter": sys.executable,
        }
        if value is None:
            v.pop(var)
        else:
            v[var] = value
        cts[name] = v
    inv = {
        "all": {
            "children": {
                "proxmox_hosts": {
                    "hosts": {
                        "pve1": {
                            "ansible_connection": "local",
                            "gpubox_root": str(root),
                            "ansible_python_interpreter": sys.executable,
                        }
                    }
                },
                "gpu_containers": {"hosts": cts},
            }
        }
    }
    p = tmp_path / "inventory.yml"
    p.write_text(yaml.safe_dump(inv, sort_keys=False, allow_unicode=True))
    return p


def _cli_error(capsys, inv: Path, box: str) -> tuple[int, str]:
    with pytest.raises(SystemExit) as ei:
        main(["-i", str(inv), "doctor", box])
    err = capsys.readouterr().err.strip()
    return ei.value.code, err


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_cli_refuses_naming_the_variable(tmp_path, capsys, case):
    name, var, value = case
    inv = _inventory(tmp_path, {"ct1": (var, value)})
    code, err = _cli_error(capsys, inv, "ct1")
    assert code == 2, err
    assert var in err and "Traceback" not in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "pve1" / "run").exists(), "DAMAGE: something was written on the host"


def _env() -> dict[str, str]:
    return dict(
        os.environ,
        ANSIBLE_CONFIG=str(PLAYBOOKS / "ansible.cfg"),
        ANSIBLE_COLLECTIONS_PATH=str(PLAYBOOKS / "collections"),
        ANSIBLE_NOCOLOR="1",
        PYTHONPATH=str(ROOT),
    )


def _module_playbook(tmp_path: Path, cases) -> Path:
    """The module itself (action doctor), once per bad value (a loop), through real ansible-playbook;
    the registered results are written to module.json."""
    items = []
    for name, var, value in cases:
        bv = {"gpubox_vmid": 200, "gpubox_proxmox_host": "pve1", "gpubox_root": str(tmp_path / name)}
        if value is None:
            bv.pop(var)
        else:
            bv[var] = value
        items.append({"name": name, "box_vars": bv})
    play = [
        {
            "hosts": "localhost",
            "gather_facts": False,
            "vars": {"ansible_python_interpreter": sys.executable, "cases": items},
            "tasks": [
                {
                    "name": "bad value",
                    "gpubox.gpubox.box": {
                        "action": "doctor",
                        "box": "ct1",
                        "box_vars": "{{ item.box_vars }}",
                        "host": "pve1",
                        "host_vars": {"gpubox_root": str(tmp_path / "pve1")},
                    },
                    "loop": "{{ cases }}",
                    "ignore_errors": True,
                    "register": "out",
                },
                {
                    "name": "keep",
                    "ansible.builtin.copy": {
                        "content": "{{ out.results | to_json }}",
                        "dest": str(tmp_path / "module.json"),
                    },
                },
            ],
        }
    ]
    p = tmp_path / "module.yml"
    p.write_text(yaml.safe_dump(play, sort_keys=False, allow_unicode=True))
    return p


@pytest.fixture(scope="module")
def playbook_bin():
    pb = _playbook_bin()
    if not pb:
        pytest.skip("ansible-playbook not installed")
    return pb


def test_module_gives_the_cli_message(tmp_path, capsys, playbook_bin):
    cases = [c for c in BAD if c[0] != "vmid-missing"] + [c for c in BAD if c[0] == "vmid-missing"]
    pb = _module_playbook(tmp_path, cases)
    p = subprocess.run(
        [playbook_bin, "-i", "localhost,", "-c", "local", str(pb)],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=600,
        cwd=tmp_path,
    )
    assert (tmp_path / "module.json").exists(), p.stdout[-3000:] + p.stderr[-3000:]
    results = {r["item"]["name"]: r for r in json.loads((tmp_path / "module.json").read_text())}
    for name, var, value in cases:
        r = results[name]
        assert r.get("failed"), (name, r)
        assert r.get("exit_code") == 2, (name, r)
        assert var in r["msg"] and "internal error" not in r["msg"], (name, r["msg"])
        (tmp_path / f"cli-{name}").mkdir()
        inv = _inventory(tmp_path / f"cli-{name}", {"ct1": (var, value)})
        code, err = _cli_error(capsys, inv, "ct1")
        assert err == f"gpubox: error: {r['msg']}", (
            f"CLI and module differ for {name}: {err!r} vs {r['msg']!r}"
        )
    assert not (tmp_path / "pve1").exists() or not any((tmp_path / "pve1").iterdir())


def _role_results(p, results_dir: Path) -> dict[str, dict]:
    d = results_dir / "doctor"
    return {f.stem: json.loads(f.read_text()) for f in d.glob("*.json") if f.stem != "summary"}


def _doctor_playbook(playbook_bin, inv, cwd, extra_vars: dict) -> subprocess.CompletedProcess:
    """The real ansible-playbook running playbooks/doctor.yml over INV with EXTRA_VARS (-e)."""
    return subprocess.run(
        [playbook_bin, "-i", str(inv), str(PLAYBOOKS / "doctor.yml"), "-e", json.dumps(extra_vars)],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=600,
        cwd=cwd,
    )


def test_playbook_refuses_each_bad_value_before_installing(tmp_path, capsys, playbook_bin):
    boxes = {n: (var, value) for n, var, value in BAD}
    inv = _inventory(tmp_path, boxes)
    results = tmp_path / "results"
    p = _doctor_playbook(playbook_bin, inv, tmp_path, {"gpubox_results_dir": str(results)})
    assert p.returncode != 0
    got = _role_results(p, results)
    for name, var, _value in BAD:
        msg = got[name].get("msg", "")
        (tmp_path / f"cli-{name}").mkdir()
        code, err = _cli_error(capsys, _inventory(tmp_path / f"cli-{name}", {name: boxes[name]}), name)
        assert err == f"gpubox: error: {msg}", f"CLI and playbook differ for {name}: {err!r} vs {msg!r}"
        assert var in msg
    assert not (tmp_path / "pve1" / "run").exists(), "DAMAGE: a lock or file appeared on the host"


@pytest.mark.parametrize(
    "extra,var",
    [
        ({"gpubox_vmid": True}, "gpubox_vmid"),
        ({"gpubox_vmid": "200; reboot"}, "gpubox_vmid"),
        ({"gpubox_env": ["A=1"]}, "gpubox_env"),
        ({"gpubox_gpus": "eight"}, "gpubox_gpus"),
    ],
    ids=["vmid-true", "vmid-shell", "env-list", "gpus-word"],
)
def test_playbook_extra_vars_pass_the_same_gate(tmp_path, playbook_bin, extra, var):
    inv = _inventory(tmp_path, {"ct1": ("gpubox_gpus", 1)})
    results = tmp_path / "results"
    p = _doctor_playbook(playbook_bin, inv, tmp_path, {"gpubox_results_dir": str(results), **extra})
    assert p.returncode != 0
    msg = _role_results(p, results)["ct1"].get("msg", "")
    assert msg.startswith(f"ct1: {var} = "), msg
    assert not (tmp_path / "pve1" / "run").exists(), "DAMAGE: a lock or file appeared on the host"


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_container_side_request_passes_the_same_gate(case):
    """bench.remote (the benchmark's container side) checks the request's variables like the CLI."""
    from gpubox.bench.remote import context_from
    from gpubox.errors import GpuboxError

    name, var, value = case
    ct = {"gpubox_vmid": 200, "gpubox_proxmox_host": "pve1", "gpubox_root": "/tmp/x"}
    if value is None:
        ct.pop(var)
    else:
        ct[var] = value
    with pytest.raises(GpuboxError) as ei:
        context_from({"container": {"name": "ct1", "vars": ct}, "host": {"name": "pve1", "vars": {}}})
    assert var in str(ei.value) and str(ei.value).startswith("ct1: "), str(ei.value)


@pytest.mark.parametrize("spelling", ["0200", "0x10"], ids=["octal", "hex"])
def test_playbook_refuses_the_inventory_spelling_the_cli_refuses(tmp_path, capsys, playbook_bin, spelling):
    """Ansible's YAML 1.1 reading turns `gpubox_vmid: 0200` into 128 before any module sees it; the
    playbook checks the inventory's source text once on the control node with the CLI's gate, so
    the CLI's error ends the play before anything is read or changed."""
    inv = _inventory(tmp_path, {"ct1": ("gpubox_gpus", 1)})
    text = inv.read_text()
    assert "gpubox_vmid: 200\n" in text
    inv.write_text(text.replace("gpubox_vmid: 200\n", f"gpubox_vmid: {spelling}\n"))
    code, err = _cli_error(capsys, inv, "ct1")
    assert code == 2 and "not a plain decimal number" in err, err
    results = tmp_path / "results"
    p = _doctor_playbook(playbook_bin, inv, tmp_path, {"gpubox_results_dir": str(results)})
    assert p.returncode != 0, p.stdout[-3000:]
    assert err.removeprefix("gpubox: error: ") in " ".join(p.stdout.split()), p.stdout[-3000:]
    assert "TASK [gpubox_box : Gpubox doctor]" not in p.stdout  # the play ended at the gate
    assert not (tmp_path / "pve1" / "run").exists(), "DAMAGE: a lock or file appeared on the host"
