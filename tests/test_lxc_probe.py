"""The in-container CUDA probe: errno classification, cuInit/driver causes and their repairs, the
real (non-simulated) branch on this machine, and the SSH path to the Proxmox host."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import zipfile

import pytest
import yaml

from gpubox.provision import cuda_probe
from gpubox.simbox import build
from gpubox.simbox.lxc import mknod
from gpubox.transport import payload
from tests.clirun import gpubox

PROBE = cuda_probe.__file__
ENTRY = "gpubox.provision.cuda_probe"


def _run_probe(env, *nodes, python=sys.executable):
    """The probe's payload as gpubox ships it (the runner's argv, the zip on stdin)."""
    p = payload.build(ENTRY)
    r = subprocess.run(p.argv(str(python), nodes), input=p.stdin(), capture_output=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _sim_env(sim):
    return dict(os.environ, GPUBOX_SIM=str(sim.dest), GPUBOX_SIM_SIDE="container")


@pytest.mark.skipif(
    os.path.exists("/dev/nvidia-uvm") or os.path.exists("/dev/nvidiactl"),
    reason="this machine has NVIDIA nodes",
)
def test_real_branch_on_a_machine_without_gpu():
    env = {k: v for k, v in os.environ.items() if k != "GPUBOX_SIM"}
    res = _run_probe(env)
    assert res["simulated"] is False
    assert res["nodes"]["/dev/nvidia-uvm"] == "ENOENT" and res["nodes"]["/dev/nvidiactl"] == "ENOENT"
    codes = [c for c, _, _ in cuda_probe.decide(res, "ct200")]
    assert "ENOENT" in codes
    if res["cuda_error"]:
        assert "no-libcuda" in codes


def test_sim_classifies_enxio_eperm_enoent(tmp_path):
    sim = build(tmp_path / "box", [], gpus=1)
    with sim.state() as st:  # a node bound before the module reload: 508:0, and a rule for 508
        st["containers"]["200"]["cgroup_allow"].append("c 508:* rwm")
    mknod(sim.cpath("/dev/nvidia-uvm"), 508, 0)
    mknod(sim.cpath("/dev/nvidia-uvm-tools"), 509, 1)  # no rule for 509
    os.unlink(sim.cpath("/dev/nvidia-modeset"))
    # the simulated container's python3 (gpubox/simbox/cuda.py) runs the shipped source's run()
    res = _run_probe(_sim_env(sim), "/dev/nvidia-modeset", python=sim.bin_dir / "python3")
    assert res["nodes"] == {
        "/dev/nvidiactl": "ok",
        "/dev/nvidia0": "ok",
        "/dev/nvidia-uvm": "ENXIO",
        "/dev/nvidia-uvm-tools": "EPERM",
        "/dev/nvidia-modeset": "ENOENT",
    }
    assert res["cuinit"] == 999 and res["cuinit_name"] == "CUDA_ERROR_UNKNOWN" and res["simulated"] is True
    found = {c: (why, fix) for c, why, fix in cuda_probe.decide(res, "ct200")}
    assert "--restart always" in found["ENXIO"][1]
    assert "lxc-cgroup" in found["EPERM"][1] and "nvidia-modprobe" in found["ENOENT"][1]
    assert "cuInit-999" in found


def test_driver_mismatch_is_803_with_its_repair(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")
    sim = build(tmp_path / "box", [], gpus=1)
    lib = sim.cpath("/usr/lib/x86_64-linux-gnu")
    os.unlink(lib / "libcuda.so.1")
    (lib / "libcuda.so.575.57.08").write_bytes(b"")
    os.symlink("libcuda.so.575.57.08", lib / "libcuda.so.1")
    rc, out, err = gpubox(capsys, "-i", sim.inventory_path, "lxc", "check", "ct200", "--json")
    cuda = json.loads(out)["steps"][-1]
    assert rc == 1 and cuda["evidence"]["cuinit"] == 803
    assert "580.95.05" in cuda["cause"] and "575.57.08" in cuda["cause"]
    assert "--no-kernel-module" in cuda["repair"]


def test_diagnose_maps_each_cuinit_code():
    base = {"nodes": {"/dev/nvidia0": "ok"}, "kernel_driver": "580.95.05", "user_driver": "580.95.05"}
    assert cuda_probe.decide({**base, "cuinit": 0}) == []
    assert cuda_probe.decide({**base, "cuinit": 100})[0][0] == "cuInit-100"
    assert (
        cuda_probe.decide({**base, "cuinit": None, "cuda_error": "libcuda.so.1 not found"})[0][0]
        == "no-libcuda"
    )
    assert cuda_probe.decide({"error": "probe exited 127: python3: not found"})[0][0] == "probe-failed"


def test_fix_over_real_ssh_to_the_proxmox_host(tmp_path, capsys, sshd, monkeypatch):
    """The Proxmox host reached through the real local sshd: SFTP reads/stat of device nodes, the
    remote commit (flock + sha1sum + mv), and commands (`nvidia-modprobe`, `pct`) over SSH."""
    monkeypatch.setenv("COLUMNS", "400")
    sim = build(tmp_path / "box", ["uvm_stale_major", "uvm_missing"], gpus=2)
    inv = yaml.safe_load(sim.inventory_path.read_text())
    pve1 = inv["all"]["children"]["proxmox_hosts"]["hosts"]["pve1"]
    pve1.update(sshd.vars())
    pve1["ansible_connection"] = "ssh"
    sim.inventory_path.write_text(yaml.safe_dump(inv))
    rc, out, err = gpubox(capsys, "-i", sim.inventory_path, "lxc", "fix", "ct200", "--yes", "--json")
    assert rc == 0, out + err
    steps = {s["name"]: s for s in json.loads(out)["steps"]}
    assert "508" in steps["container-config"]["detail"] and "not loaded" in steps["host-devices"]["detail"]
    assert "c 511:* rwm" in sim.hpath("/etc/pve/lxc/200.conf").read_text()
    rc, out, err = gpubox(capsys, "-i", sim.inventory_path, "lxc", "fix", "ct200", "--yes", "--json")
    assert rc == 0 and json.loads(out)["changed"] is False


def test_the_simulated_python3_runs_every_other_script_unchanged(tmp_path):
    """Only the probe's payload holding its exact source gets the simulated reads; any other script
    or payload (the probe with one byte changed included) runs with the real python3 that comes
    next on PATH, stdin and args kept."""
    sim = build(tmp_path / "box", [], gpus=1)
    py = sim.bin_dir / "python3"
    script = "import sys; print(sys.argv[1:], sys.stdin.read() == '', sys.executable != '')"
    r = subprocess.run([py, "-", "a", "b"], input=script, capture_output=True, text=True, env=_sim_env(sim))
    assert r.returncode == 0 and r.stdout.strip() == "['a', 'b'] True True", r.stderr
    r = subprocess.run([py, "-c", "import sys; sys.exit(3)"], env=_sim_env(sim), timeout=60)
    assert r.returncode == 3
    changed = open(PROBE).read() + "\n# not the shipped probe\n"
    r = subprocess.run(
        [py, "-"], input=changed, capture_output=True, text=True, env=_sim_env(sim), timeout=60
    )
    assert r.returncode == 0 and json.loads(r.stdout)["simulated"] is False
    # the probe's payload with one byte of its source changed: the real python3 runs it
    p = payload.build(ENTRY)
    files, _ = payload.unpack(p.stdin())
    assert files[ENTRY] == open(PROBE, "rb").read()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, src in files.items():
            arc = name.replace(".", "/") + ("/__init__.py" if name != ENTRY else ".py")
            z.writestr(arc, src + b"\n# not the shipped probe\n" if name == ENTRY else src)
    altered = payload.Payload(ENTRY, p.modules, buf.getvalue(), hashlib.sha256(buf.getvalue()).hexdigest())
    r = subprocess.run(
        altered.argv(str(py)), input=altered.stdin(), capture_output=True, env=_sim_env(sim), timeout=60
    )
    assert r.returncode == 0 and json.loads(r.stdout)["simulated"] is False
    # a zip cut short on the way is refused by the loader, before anything runs
    cut = p.stdin()[:-100]
    r = subprocess.run(p.argv(str(py)), input=cut, capture_output=True, env=_sim_env(sim), timeout=60)
    assert r.returncode == 2 and b"truncated or altered" in r.stderr
    # another entry's payload runs unchanged, with its own stdin after the zip
    r = subprocess.run(
        payload.build("gpubox.bench.remote").argv(str(py)),
        input=payload.build("gpubox.bench.remote").stdin(b"not json"),
        capture_output=True,
        env=_sim_env(sim),
        timeout=60,
    )
    assert r.returncode == 2 and "not JSON" in json.loads(r.stdout)["error"]["problem"]
