"""The playbooks, run for real: ansible-playbook against simulated boxes on three "Proxmox hosts",
one reached with the local connection and two over real SSH (sshd on 127.0.0.2 and 127.0.0.3),
each with its own gpubox_root, venv and state directory.

One fleet is built per module and taken through doctor -> recover --check --diff -> recover ->
recover again; each test asserts one promise on the recorded runs. A second fleet holds a box
whose config is locked and a box whose Proxmox host cannot be reached, next to a healthy one.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpubox.context import Context
from gpubox.inventory import Inventory
from gpubox.simbox import build
from tests.bench_helpers import fell_behind

ROOT = Path(__file__).resolve().parent.parent
PLAYBOOKS = ROOT / "playbooks"
RECAP = re.compile(
    r"^(\S+)\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)\s+"
    r"skipped=(\d+)\s+rescued=(\d+)\s+ignored=(\d+)",
    re.M,
)

pytestmark = pytest.mark.skipif(shutil.which("ansible-playbook") is None, reason="ansible-core not installed")


def _need_wheel_builder():
    """The install role builds the wheel with the control node's own setuptools: 77+ reads the SPDX
    `license` of pyproject.toml (PEP 639) and builds wheels without the `wheel` package."""
    import setuptools

    if int(setuptools.__version__.split(".")[0]) < 77:
        pytest.fail(
            f"building the gpubox wheel needs setuptools >= 77 on the control node, this one has "
            f"{setuptools.__version__}: pip install -U 'setuptools>=77'"
        )


def recap(out: str) -> dict[str, dict[str, int]]:
    keys = ("ok", "changed", "unreachable", "failed", "skipped", "rescued", "ignored")
    return {m.group(1): dict(zip(keys, map(int, m.groups()[1:]))) for m in RECAP.finditer(out)}


def tree_digest(sim_dir: Path) -> dict[str, str]:
    """Content hash of every file of a simulated box (the call log aside: stand-ins append to it)."""
    out = {}
    for p in sorted(sim_dir.rglob("*")):
        if p.is_file() and not p.is_symlink() and p.name not in ("calls.jsonl", ".sim.lock"):
            out[str(p.relative_to(sim_dir))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _venv_seeing_our_deps(venv: Path) -> None:
    """When the tests run in a venv (README's `.venv`), `--system-site-packages` of a venv made from it
    means the BASE interpreter's packages, which lack gpubox's dependencies (offline: gpubox_wheel_deps
    is false). Make that venv the way the role would, plus a .pth naming this venv's site-packages
    (appended after its own, so the role's wheel still wins over this checkout's editable install)."""
    if sys.prefix == sys.base_prefix or (venv / "bin" / "python").exists():
        return
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    import site

    ours = [p for p in site.getsitepackages() if p.startswith(sys.prefix)]
    (pure,) = {Path(p) for p in venv.glob("lib/python*/site-packages")}
    (pure / "zz-gpubox-test-deps.pth").write_text("".join(f"{p}\n" for p in ours))


class Fleet:
    """Simulated boxes, one inventory, and a runner for ansible-playbook."""

    def __init__(self, base: Path, source: Path, wheel_dir: Path):
        self.base = base
        self.source = source
        self.wheel_dir = wheel_dir
        self.results = base / "results"
        self.sims: dict[str, object] = {}
        self.inv: dict = {
            "all": {"children": {"proxmox_hosts": {"hosts": {}}, "gpu_containers": {"hosts": {}}}}
        }

    @property
    def inventory_path(self) -> Path:
        return self.base / "inventory.yml"

    def add(self, box: str, host: str, vmid: int, faults, conn: dict, venv: Path) -> None:
        """A simulated box; its Proxmox host is reached with `conn` (local or one sshd's vars)."""
        sim = build(self.base / box, faults, vmid=vmid, box=box, host=host)
        self.sims[box] = sim
        sim_inv = yaml.safe_load(sim.inventory_path.read_text())["all"]["children"]
        hv = dict(sim_inv["proxmox_hosts"]["hosts"][host])
        hv.pop("ansible_connection", None)
        hv.update(conn)
        # The venv is made by this interpreter (over SSH `python3` would be the distribution's).
        hv["gpubox_venv_python"] = sys.executable
        _venv_seeing_our_deps(venv)
        hv.update(
            gpubox_home=f"{venv}-home",
            gpubox_venv=str(venv),
            gpubox_venv_system_site_packages=True,
            gpubox_wheel_deps=False,
            gpubox_state_dir=str(self.base / f"state-{host}"),
        )
        self.inv["all"]["children"]["proxmox_hosts"]["hosts"][host] = hv
        # The container is this machine too (bench runs "inside" it): same venv, never /opt/gpubox.
        install = {
            k: hv[k]
            for k in (
                "gpubox_home",
                "gpubox_venv",
                "gpubox_venv_python",
                "gpubox_venv_system_site_packages",
                "gpubox_wheel_deps",
            )
        }
        self.inv["all"]["children"]["gpu_containers"]["hosts"][box] = {
            **sim_inv["gpu_containers"]["hosts"][box],
            **install,
            "ansible_python_interpreter": sys.executable,
            "gpubox_state_dir": str(self.base / f"state-{box}"),
        }

    def add_raw(self, group: str, name: str, variables: dict) -> None:
        self.inv["all"]["children"][group]["hosts"][name] = variables

    def write(self) -> Path:
        self.inventory_path.write_text(yaml.safe_dump(self.inv, sort_keys=False))
        return self.inventory_path

    def play(self, playbook: str, *args: str, timeout: int = 240) -> subprocess.CompletedProcess:
        env = dict(
            os.environ,
            ANSIBLE_CONFIG=str(PLAYBOOKS / "ansible.cfg"),
            ANSIBLE_NOCOLOR="1",
            ANSIBLE_FORCE_COLOR="0",
            ANSIBLE_LOCAL_TEMP=str(self.base / ".ansible-tmp"),
            ANSIBLE_SSH_CONTROL_PATH_DIR=str(self.base / ".cp"),
            PYTHONUNBUFFERED="1",
        )
        argv = [
            "ansible-playbook",
            "-i",
            str(self.inventory_path),
            str(PLAYBOOKS / playbook),
            "-e",
            json.dumps(
                {
                    "gpubox_results_dir": str(self.results),
                    "gpubox_source": str(self.source),
                    "gpubox_wheel_dir": str(self.wheel_dir),
                    "gpubox_bench_enabled": False,
                }
            ),
            *args,
        ]
        p = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout, cwd=self.base)
        self.nruns = getattr(self, "nruns", 0) + 1
        (self.base / f"run{self.nruns}-{playbook}.log").write_text(
            f"{argv}\n{p.returncode}\n{p.stdout}\n{p.stderr}"
        )
        p.recap = recap(p.stdout)  # type: ignore[attr-defined]
        return p

    def doctor_ok(self, box: str) -> bool:
        """The CLI's doctor, in-process, on the box's own simulated inventory."""
        from gpubox.provision.recover import doctor

        inv = Inventory(self.sims[box].inventory_path)
        return doctor(Context(box=inv.box(box), inventory=inv, options={})).ok


def _snapshot_source(dest: Path) -> Path:
    """A frozen copy of the checkout: other edits while the tests run must not change the wheel."""
    ignore = shutil.ignore_patterns(
        ".git",
        "__pycache__",
        "*.pyc",
        "*.egg-info",
        "build",
        "dist",
        "tests",
        ".venv",
        "venv",
        ".pytest_cache",
        "results",
        "out",
        ".whl",
    )
    shutil.copytree(ROOT, dest, ignore=ignore)
    return dest


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    _need_wheel_builder()
    base = tmp_path_factory.mktemp("ansible")
    return {
        "base": base,
        "source": _snapshot_source(base / "src"),
        "wheels": base / "wheels",
        "venvs": base / "venvs",
    }


@pytest.fixture(scope="module")
def fleet(workspace, sshd_factory):
    """Three boxes with the seed's reboot faults (and more), and the runs the tests look at."""
    ws = workspace
    f = Fleet(ws["base"] / "fleet", ws["source"], ws["wheels"])
    f.base.mkdir()
    b, c = sshd_factory("127.0.0.2"), sshd_factory("127.0.0.3")
    py = {"ansible_python_interpreter": sys.executable}
    f.add("ct-a", "pve-a", 201, ["seed"], {"ansible_connection": "local", **py}, ws["venvs"] / "pve-a")
    f.add(
        "ct-b",
        "pve-b",
        202,
        ["uvm_stale_major", "mrrs_512", "nccl_misspelled", "shm_empty"],
        b.vars(),
        ws["venvs"] / "pve-b",
    )
    f.add(
        "ct-c",
        "pve-c",
        203,
        ["container_stopped", "numa_balancing", "conf_pending", "uvm_missing"],
        c.vars(),
        ws["venvs"] / "pve-c",
    )
    f.write()
    runs = {}
    # Nothing installed yet: doctor reads nothing, installs nothing, builds no wheel, names the hosts.
    runs["fresh_digest"] = {n: tree_digest(s.dest) for n, s in f.sims.items()}
    runs["fresh_doctor"] = f.play("doctor.yml")
    runs["fresh_digest_after"] = {n: tree_digest(s.dest) for n, s in f.sims.items()}
    runs["fresh_wheels"] = sorted(p.name for p in ws["wheels"].rglob("*.whl"))
    runs["fresh_summary"] = json.loads((f.results / "doctor" / "summary.json").read_text())
    runs["fresh_check"] = f.play("recover.yml", "--check")
    runs["fresh_check_wheels"] = sorted(p.name for p in ws["wheels"].rglob("*.whl"))
    runs["fresh_installed"] = sorted(
        str(p)
        for h in ("pve-a", "pve-b", "pve-c")
        for p in (ws["venvs"] / h / ".gpubox-build", Path(f"{ws['venvs'] / h}-home"))
        if p.exists()
    )
    runs["install"] = f.play("install.yml")
    runs["doctor"] = f.play("doctor.yml")
    runs["digest_before_check"] = {n: tree_digest(s.dest) for n, s in f.sims.items()}
    runs["check"] = f.play("recover.yml", "--check", "--diff")
    runs["digest_after_check"] = {n: tree_digest(s.dest) for n, s in f.sims.items()}
    runs["check_results"] = {n: json.loads((f.results / "recover" / f"{n}.json").read_text()) for n in f.sims}
    runs["recover"] = f.play("recover.yml")
    runs["recover_results"] = {
        n: json.loads((f.results / "recover" / f"{n}.json").read_text()) for n in f.sims
    }
    runs["summary"] = json.loads((f.results / "recover" / "summary.json").read_text())
    runs["again"] = f.play("recover.yml")
    f.runs = runs
    return f


def _explain(p) -> str:
    return f"rc={p.returncode}\n--- stdout ---\n{p.stdout[-6000:]}\n--- stderr ---\n{p.stderr[-3000:]}"


# -- static checks ---------------------------------------------------------------------------------
def test_syntax_check_every_playbook(tmp_path):
    inv = tmp_path / "inv.yml"
    inv.write_text((ROOT / "inventory" / "example.yml").read_text())
    books = [
        str(PLAYBOOKS / b)
        for b in (
            "recover.yml",
            "doctor.yml",
            "tune.yml",
            "stage.yml",
            "bench.yml",
            "install.yml",
            "autostart.yml",
        )
    ]
    p = subprocess.run(
        ["ansible-playbook", "--syntax-check", "-i", str(inv), *books],
        capture_output=True,
        text=True,
        env=dict(os.environ, ANSIBLE_CONFIG=str(PLAYBOOKS / "ansible.cfg")),
    )
    assert p.returncode == 0, _explain(p)
    assert p.stdout.count("playbook: ") == len(books)


@pytest.mark.parametrize("with_cfg", [True, False], ids=["ansible.cfg", "no-cfg"])
def test_a_wrong_inventory_path_fails_the_playbook(tmp_path, with_cfg):
    """Ansible alone warns and runs over an empty inventory, exiting 0."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    if with_cfg:
        env["ANSIBLE_CONFIG"] = str(PLAYBOOKS / "ansible.cfg")
    p = subprocess.run(
        ["ansible-playbook", "-i", str(tmp_path / "no-such-inventory.yml"), str(PLAYBOOKS / "doctor.yml")],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert p.returncode != 0, _explain(p)
    out = p.stdout + p.stderr
    assert ("inventory" in out and "parse" in out) or "no boxes" in out, _explain(p)


@pytest.mark.skipif(shutil.which("ansible-lint") is None, reason="ansible-lint not installed (test extra)")
def test_ansible_lint_production_profile_is_clean():
    p = subprocess.run(
        [
            "ansible-lint",
            "--offline",
            "--nocolor",
            "-c",
            str(PLAYBOOKS / ".ansible-lint"),
            "--profile",
            "production",
            "playbooks/",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=dict(os.environ, NO_COLOR="1", ANSIBLE_COLLECTIONS_PATH=str(PLAYBOOKS / "collections")),
        timeout=300,
    )
    assert p.returncode == 0, _explain(p)
    assert "Profile 'production' was required, and it passed" in p.stdout + p.stderr


# -- the fleet -------------------------------------------------------------------------------------
def test_doctor_on_a_fresh_fleet_changes_nothing_and_names_the_hosts_to_install(fleet, workspace):
    p = fleet.runs["fresh_doctor"]
    assert p.returncode != 0, _explain(p)  # nothing could be checked
    assert {b: p.recap[b]["changed"] for b in ("ct-a", "ct-b", "ct-c")} == dict.fromkeys(
        ("ct-a", "ct-b", "ct-c"), 0
    ), _explain(p)
    assert fleet.runs["fresh_digest"] == fleet.runs["fresh_digest_after"]
    assert fleet.runs["fresh_wheels"] == []  # no wheel built, in the cache or the checkout
    assert not (workspace["source"] / ".whl").exists() and not (workspace["source"] / "build").exists()
    assert fleet.runs["fresh_installed"] == []  # nothing installed on any host
    # --check likewise: no wheel, no install, changed=0, and the same hosts named.
    c = fleet.runs["fresh_check"]
    assert {b: c.recap[b]["changed"] for b in ("ct-a", "ct-b", "ct-c")} == dict.fromkeys(
        ("ct-a", "ct-b", "ct-c"), 0
    ), _explain(c)
    assert fleet.runs["fresh_check_wheels"] == [] and "TASK [gpubox_install" not in c.stdout, _explain(c)
    assert "needs playbooks/install.yml (this build is not there): pve-a, pve-b, pve-c" in c.stdout, _explain(
        c
    )
    summary = fleet.runs["fresh_summary"]
    assert summary["needs_install"] == ["pve-a", "pve-b", "pve-c"] and summary["failed"] == [
        "ct-a",
        "ct-b",
        "ct-c",
    ]
    assert "run playbooks/install.yml -l pve-b" in summary["boxes"]["ct-b"]["reason"]
    assert "needs playbooks/install.yml (this build is not there): pve-a, pve-b, pve-c" in p.stdout, _explain(
        p
    )


def test_install_puts_this_build_on_every_host(fleet, workspace):
    p = fleet.runs["install"]
    assert p.returncode == 0, _explain(p)
    assert all(p.recap[h]["changed"] >= 1 for h in ("pve-a", "pve-b", "pve-c")), _explain(p)
    (wheel,) = workspace["wheels"].rglob("*.whl")  # built once, into the cache folder of its build
    build = wheel.parent.name
    assert re.fullmatch(r"0\.\d+\.\d+\+[0-9a-f]{12}", build), build
    for host in ("pve-a", "pve-b", "pve-c"):
        assert (workspace["venvs"] / host / ".gpubox-build").read_text().strip() == build


def test_doctor_fails_with_the_findings_and_changes_nothing(fleet):
    p = fleet.runs["doctor"]
    assert p.returncode != 0, _explain(p)  # the summary fails the run: every box has findings
    assert set(p.recap) >= {"ct-a", "ct-b", "ct-c"}, _explain(p)
    assert all(p.recap[b]["changed"] == 0 for b in p.recap), _explain(p)
    assert "box(es) degraded/failed: ct-a, ct-b, ct-c" in p.stdout, _explain(p)
    assert "TASK [gpubox_install" not in p.stdout, _explain(p)  # no install task ran
    res = json.loads((fleet.results / "doctor" / "ct-b.json").read_text())
    # The module ran from the venv the role built on the managed host, not from this checkout.
    assert res["gpubox_location"].startswith(str(fleet.base.parent / "venvs" / "pve-b")), res[
        "gpubox_location"
    ]
    by_name = {s["name"]: s for s in res["steps"]}
    assert by_name["container-config"]["status"] == "drift"
    assert by_name["pcie-mrrs"]["status"] == "drift"
    assert res["mode"] == "check" and res["ok"] is False and res["exit_code"] == 1


def test_check_diff_changes_no_file_and_shows_the_diffs(fleet):
    p = fleet.runs["check"]
    assert fleet.runs["digest_before_check"] == fleet.runs["digest_after_check"]
    assert p.returncode == 0, _explain(p)  # drift in check mode is a plan, not a failure
    for box in ("ct-a", "ct-b", "ct-c"):
        assert p.recap[box]["failed"] == 0 and p.recap[box]["ignored"] == 0, _explain(p)
        assert p.recap[box]["changed"] >= 1, _explain(p)  # "would change"
        res = fleet.runs["check_results"][box]
        assert res["mode"] == "plan" and res["changed"] is True
    # ct-b's stale uvm major (508) is taken out of the main section; the diff shows it.
    assert re.search(r"^-lxc\.cgroup2\.devices\.allow: c 508:\* rwm$", p.stdout, re.M), _explain(p)
    assert "# run: setpci -A linux-sysfs" in p.stdout and "CAP_EXP+8.w=5000:7000" in p.stdout
    assert "+kernel.numa_balancing = 0" in p.stdout  # ct-c's host
    assert "# run: nvidia-modprobe -u" in p.stdout  # ct-a's and ct-c's hosts
    # ct-a (the seed's box: uvm not loaded, rule at the stale 508): --check --diff shows the rule
    # replaced by one at the major read after modprobe, not deleted (issue 29), and apply wrote
    # that plan with the major filled in
    shown = "+lxc.cgroup2.devices.allow: c <nvidia-uvm major, read after modprobe>:* rwm"
    assert shown in p.stdout, _explain(p)
    cc = {s["name"]: s for s in fleet.runs["recover_results"]["ct-a"]["steps"]}["container-config"]
    assert (
        cc["status"] == "fixed"
        and "as planned" in cc["detail"]
        and "+lxc.cgroup2.devices.allow: c 511:* rwm" in cc["diff"]
    )


def test_fault_run_repairs_every_box(fleet):
    p = fleet.runs["recover"]
    assert p.returncode == 0, _explain(p)
    for box in ("ct-a", "ct-b", "ct-c"):
        assert p.recap[box]["failed"] == 0 and p.recap[box]["ignored"] == 0, _explain(p)
        res = fleet.runs["recover_results"][box]
        assert res["ok"] is True and res["changed"] is True and res["mode"] == "apply"
        assert {s["status"] for s in res["steps"]} <= {"ok", "fixed", "skipped"}
        assert fleet.doctor_ok(box), f"{box} still has problems after the playbook"
    fixed = {s["name"] for s in fleet.runs["recover_results"]["ct-b"]["steps"] if s["status"] == "fixed"}
    assert {"container-config", "pcie-mrrs", "nccl-env", "model-stage"} <= fixed
    summary = fleet.runs["summary"]
    assert summary["healthy"] == ["ct-a", "ct-b", "ct-c"] and summary["failed"] == []
    assert "gpubox recover: 3 healthy, 0 degraded, 0 failed" in p.stdout


def test_second_run_changes_nothing(fleet):
    p = fleet.runs["again"]
    assert p.returncode == 0, _explain(p)
    rc = p.recap
    boxes = {b: rc[b] for b in ("ct-a", "ct-b", "ct-c")}
    assert {b: boxes[b]["changed"] for b in boxes} == {"ct-a": 0, "ct-b": 0, "ct-c": 0}, _explain(p)
    assert all(boxes[b]["failed"] == 0 and boxes[b]["ok"] > 0 for b in boxes), _explain(p)
    # Every host has this build: no wheel build, no install task, one module call per box.
    assert "Build the wheel" not in p.stdout and "TASK [gpubox_install" not in p.stdout, _explain(p)
    assert p.stdout.count("TASK [gpubox_box : Gpubox recover]") == 1, _explain(p)


def test_a_host_with_another_build_is_named_not_checked(fleet, workspace):
    """doctor never installs: a host whose venv holds another build is named for install.yml."""
    marker = workspace["venvs"] / "pve-a" / ".gpubox-build"
    build = marker.read_text()
    marker.write_text("0.0.1+000000000000\n")
    try:
        p = fleet.play("doctor.yml", "-l", "ct-a")
    finally:
        marker.write_text(build)
    assert p.returncode != 0 and p.recap["ct-a"]["changed"] == 0, _explain(p)
    reason = json.loads((fleet.results / "doctor" / "summary.json").read_text())["boxes"]["ct-a"]["reason"]
    assert "installed: 0.0.1+000000000000" in reason and "install.yml -l pve-a" in reason, reason


def test_bench_playbook_runs_the_short_simulated_benchmark(fleet):
    """bench.yml on the local box: gpubox in the container (here: this machine), one TP x method."""
    p = fleet.play(
        "bench.yml",
        "-l",
        "ct-a",
        "-e",
        json.dumps({"gpubox_bench_enabled": True, "gpubox_bench_tp": [1], "gpubox_bench_methods": ["auto"]}),
    )
    behind = fell_behind(fleet.sims["ct-a"])  # this machine could not keep the simulator's pace
    assert p.returncode == 0 or behind, _explain(p)
    res = json.loads((fleet.results / "bench" / "ct-a.json").read_text())
    assert res["verdict"]["status"] == "healthy" or behind, res["verdict"]
    assert [m["key"].split("/")[:2] for m in res["measurements"]] == [["tp1", "auto"]] * len(
        res["measurements"]
    )
    # The result file was written on the box (its state dir) and fetched to the control node.
    assert res["result_path"].startswith(str(fleet.base / "state-ct-a"))
    fetched = list((fleet.results / "bench" / "ct-a").glob("*.json"))
    assert [f.name for f in fetched] == [Path(res["result_path"]).name]
    assert json.loads(fetched[0].read_text())["verdict"] == res["verdict"]


def test_recover_with_bench_adds_the_verdict(fleet):
    """recover.yml with gpubox_bench_enabled: repair on the host, then the benchmark in the container."""
    p = fleet.play(
        "recover.yml",
        "-l",
        "ct-a",
        "-e",
        json.dumps({"gpubox_bench_enabled": True, "gpubox_bench_tp": [1], "gpubox_bench_methods": ["auto"]}),
    )
    behind = fell_behind(fleet.sims["ct-a"])
    assert p.returncode == 0 or behind, _explain(p)
    res = json.loads((fleet.results / "recover" / "ct-a.json").read_text())
    assert res["mode"] == "apply" and (res["ok"] is True or behind)
    assert res["benchmark"]["verdict"]["status"] == "healthy" or behind
    assert Path(res["benchmark"]["result"]).name in {
        f.name for f in (fleet.results / "bench" / "ct-a").glob("*.json")
    }


def test_tune_and_stage_playbooks_repair_only_their_part(fleet):
    sim = fleet.sims["ct-a"]
    sim.hpath("/proc/sys/kernel/numa_balancing").write_text("1\n")  # a reboot turned it back on
    shutil.rmtree(sim.cpath("/dev/shm"))  # and emptied the tmpfs
    sim.cpath("/dev/shm").mkdir()
    t = fleet.play("tune.yml", "-l", "ct-a")
    assert t.returncode == 0, _explain(t)
    tuned = json.loads((fleet.results / "tune" / "ct-a.json").read_text())
    assert {s["name"]: s["status"] for s in tuned["steps"]}["numa-balancing"] == "fixed"
    assert not any(s["name"].endswith("-stage") for s in tuned["steps"])
    assert sim.hpath("/proc/sys/kernel/numa_balancing").read_text().strip() == "0"
    assert not fleet.doctor_ok("ct-a")  # weights still missing
    st = fleet.play("stage.yml", "-l", "ct-a")
    assert st.returncode == 0, _explain(st)
    staged = json.loads((fleet.results / "stage" / "ct-a.json").read_text())
    assert {s["name"]: s["status"] for s in staged["steps"]} == {
        "model-stage": "fixed",
        "drafter-stage": "fixed",
    }
    assert fleet.doctor_ok("ct-a")


# -- one box fails, the others carry on ------------------------------------------------------------
def _closed_port(addr: str) -> int:
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]  # closed again when the socket is: nothing listens there


def test_a_failing_box_does_not_stop_the_others(workspace, sshd_factory, fleet):
    ws = workspace
    f = Fleet(ws["base"] / "broken", ws["source"], ws["wheels"])
    f.base.mkdir()
    b = sshd_factory("127.0.0.2")
    py = {"ansible_python_interpreter": sys.executable}
    # ct-ok's host has no gpubox yet: recover.yml installs this build there first (the wheel is
    # already in the cache). ct-locked's host has it (the first fleet's pve-b venv).
    f.add(
        "ct-ok",
        "pve-ok",
        211,
        ["numa_balancing", "nccl_missing"],
        {"ansible_connection": "local", **py},
        ws["venvs"] / "pve-ok",
    )
    f.add("ct-locked", "pve-locked", 212, ["conf_locked", "uvm_stale_major"], b.vars(), ws["venvs"] / "pve-b")
    port = _closed_port("127.0.0.4")
    f.add_raw(
        "proxmox_hosts",
        "pve-gone",
        {
            "ansible_connection": "ssh",
            "ansible_host": "127.0.0.4",
            "ansible_port": port,
            "ansible_user": "root",
            "ansible_ssh_common_args": "-o ConnectTimeout=5 -o StrictHostKeyChecking=yes "
            f"-o UserKnownHostsFile={b.known_hosts}",
            **py,
        },
    )
    f.add_raw("gpu_containers", "ct-gone", {"gpubox_vmid": 213, "gpubox_proxmox_host": "pve-gone"})
    f.write()
    before = tree_digest(f.sims["ct-locked"].dest / "pve-locked" / "etc" / "pve")
    p = f.play("recover.yml")
    assert p.returncode != 0, _explain(p)
    summary = json.loads((f.results / "recover" / "summary.json").read_text())
    assert summary["healthy"] == ["ct-ok"], summary
    assert summary["failed"] == ["ct-gone", "ct-locked"], summary
    assert "locked" in summary["boxes"]["ct-locked"]["reason"]
    assert "cannot reach pve-gone" in summary["boxes"]["ct-gone"]["reason"]
    # The healthy box was repaired all the same, and the locked config was not touched.
    assert f.doctor_ok("ct-ok")
    assert tree_digest(f.sims["ct-locked"].dest / "pve-locked" / "etc" / "pve") == before
    # The final task names the failed boxes.
    assert re.search(r"2 box\(es\) failed: ct-gone, ct-locked", p.stdout), _explain(p)
    # Only the broken boxes' calls failed (each became its box's result); the final task (run
    # once) fails the whole play at the end.
    assert {b: p.recap[b]["ignored"] for b in ("ct-ok", "ct-locked")} == {"ct-ok": 0, "ct-locked": 1}, (
        _explain(p)
    )
    ok_res = json.loads((f.results / "recover" / "ct-ok.json").read_text())
    assert ok_res["ok"] is True and {"numa-balancing", "nccl-env"} <= {
        s["name"] for s in ok_res["steps"] if s["status"] == "fixed"
    }
    # Installed on demand on pve-ok only (the wheel came from the cache: no second build).
    assert ok_res["gpubox_location"].startswith(str(ws["venvs"] / "pve-ok")), ok_res["gpubox_location"]
    assert re.search(r"changed: \[ct-ok -> pve-ok\]", p.stdout), _explain(p)  # the install tasks
    assert len(list(ws["wheels"].rglob("*.whl"))) == 1
