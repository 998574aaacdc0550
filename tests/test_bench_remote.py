"""The verification benchmark on a container gpubox reaches remotely (issues 6 and 8).

The simulated box with its container reached over REAL SSH (tests/sshd.py) or `pct exec` (the
simulated Proxmox host's `pct` stand-in): `gpubox bench` and `gpubox recover` launch the simulated
server inside the "container" through bench.remote's payload (gpubox.transport.payload) run with
`<gpubox_python>`, and the result comes back with the verdict, the history entry and the server
logs on the control side. gpubox need not be installed in the container: a python that cannot
import gpubox but has the benchmark's libraries runs it; one without the libraries gives the
one-line error naming the fix.

The remote python is sys.executable (sshd's PATH has no pyenv), or a wrapper of it that cannot
import gpubox.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpubox.simbox import build
from gpubox.transport import payload
from tests.bench_helpers import fell_behind
from tests.clirun import gpubox

SMALL = {"tp": [1], "methods": ["auto"], "repetitions": 1, "warmup": 1}


def _inventory(
    sim, tmp_path: Path, *, container: dict, host: dict | None = None, python: str | None = sys.executable
) -> str:
    """The sim's inventory with the container (and host) reached another way, a small profile."""
    inv = yaml.safe_load(sim.inventory_path.read_text())
    kids = inv["all"]["children"]
    ct = kids["gpu_containers"]["hosts"]["ct200"]
    ct.pop("ansible_connection")
    ct.update(container)
    if host is not None:
        h = kids["proxmox_hosts"]["hosts"]["pve1"]
        h.pop("ansible_connection")
        h.update(host)
    ct["gpubox_bench"].update(SMALL)
    if python is not None:
        ct["gpubox_python"] = python
    path = tmp_path / "remote-inventory.yml"
    path.write_text(yaml.safe_dump(inv))
    return str(path)


def _bench(capsys, inv, tmp_path):
    rc, out, err = gpubox(capsys, "-i", inv, "bench", "ct200", "--json", "--out", tmp_path / "results")
    return rc, out, err


def _recording_python(tmp_path: Path) -> tuple[str, Path]:
    """An interpreter wrapper that records each call: proof the control side went through it."""
    calls = tmp_path / "python-calls.log"
    w = tmp_path / "recording-python"
    w.write_text(f'#!/bin/sh\necho "$*" >> {calls}\nexec {sys.executable} "$@"\n')
    w.chmod(0o755)
    return str(w), calls


def _no_gpubox_python(tmp_path: Path) -> str:
    """A python that cannot import gpubox nor the benchmark's libraries: no site-packages (-S) and a
    cwd without the checkout."""
    w = tmp_path / "bare-python"
    w.write_text(f'#!/bin/sh\ncd /\nexec {sys.executable} -S "$@"\n')
    w.chmod(0o755)
    return str(w)


def _server_venv_python(tmp_path: Path) -> str:
    """A python like an inference server's venv: this venv's libraries, no gpubox. With -S the
    .pth files are not read, so the editable install's finder is never set up; site-packages on
    PYTHONPATH brings every library, and a cwd without the checkout leaves gpubox out."""
    import sysconfig

    site = sysconfig.get_paths()["purelib"]
    w = tmp_path / "server-python"
    w.write_text(f'#!/bin/sh\ncd /\nPYTHONPATH={site} exec {sys.executable} -S "$@"\n')
    w.chmod(0o755)
    r = subprocess.run([str(w), "-c", "import httpx, gpubox"], capture_output=True, text=True)
    assert r.returncode == 1 and "No module named 'gpubox'" in r.stderr, r.stderr
    return str(w)


def _container_logs(sim) -> list[Path]:
    return sorted(sim.cpath("/var/tmp/gpubox/bench-logs").glob("*/*.log"))


def _bench_over_ssh(sim, sshd, tmp_path, capsys, python: str) -> dict:
    """`gpubox bench` of the box with host and container reached over the real sshd and the
    container side run by PYTHON: its record, checked healthy (unless the simulator fell behind
    its own plan) with the one TP1 server ok."""
    inv = _inventory(sim, tmp_path, container=sshd.vars(), host=sshd.vars(), python=python)
    rc, out, err = _bench(capsys, inv, tmp_path)
    assert rc == 0 or fell_behind(sim), err
    doc = json.loads(out)
    assert doc["verdict"]["status"] == "healthy" or fell_behind(sim), doc["verdict"]
    assert [(s["tp"], s["label"], s["status"]) for s in doc["servers"]] == [(1, "auto", "ok")]
    return doc


def test_bench_over_ssh_measures_inside_the_container(sshd, tmp_path, capsys):
    sim = build(tmp_path / "box", [])
    python, calls = _recording_python(tmp_path)
    doc = _bench_over_ssh(sim, sshd, tmp_path, capsys, python)
    ok = [m for m in doc["measurements"] if m["status"] == "ok"]
    assert ok and len(ok) == len(doc["measurements"]) and all(m["samples"] for m in ok)
    # The probe and the measuring run both went through the container's gpubox_python over SSH,
    # as bench.remote's payload (the runner's loader on stdin: nothing installed, nothing written)...
    digest = payload.build("gpubox.bench.remote").short
    boot = f"-c {payload.BOOT} gpubox.bench.remote {digest}"
    assert calls.read_text().splitlines() == [f"{boot} --check", boot]
    # ...the server was launched there (its log under the container's root)...
    remote_logs = _container_logs(sim)
    assert [p.name for p in remote_logs] == ["tp1-auto.log"] and doc["run_id"] in str(remote_logs[0])
    # ...and the control side holds the result, a copy of the log, and the host facts it gathered.
    log = Path(doc["servers"][0]["log"])
    assert log.is_file() and log.read_bytes() == remote_logs[0].read_bytes()
    assert str(log).startswith(str(tmp_path / "results"))
    assert (
        Path(doc["path"]).is_file() and json.loads(Path(doc["path"]).read_text())["run_id"] == doc["run_id"]
    )
    assert doc["facts"]["numa_balancing"] == 0 and doc["facts"]["nccl_profile"] == "pcie-2numa"
    # The NCCL profile resolved on the control side reaches the server's environment.
    assert doc["servers"][0]["env"]["NCCL_ALGO"] == doc["facts"]["nccl_env"]["NCCL_ALGO"]
    # The history store on the control side has the run (what the next verdict compares with).
    rc, out, err = gpubox(capsys, "history", "ct200", "--json")
    assert rc == 0 and doc["run_id"] in out


def test_recover_over_ssh_ends_with_a_healthy_benchmark(sshd, tmp_path, capsys):
    sim = build(tmp_path / "box", ["numa_balancing"])
    inv = _inventory(sim, tmp_path, container=sshd.vars(), host=sshd.vars())
    rc, out, err = gpubox(capsys, "-i", inv, "recover", "ct200", "--yes", "--json")
    rec = json.loads(out)
    steps = {s["name"]: s for s in rec["steps"]}
    assert rc == 0 or fell_behind(sim), [(s["name"], s["status"], s["detail"]) for s in rec["steps"]]
    assert steps["numa-balancing"]["status"] == "fixed"
    assert (steps["bench"]["status"] == "ok" and "healthy" in steps["bench"]["detail"]) or fell_behind(sim)
    bench_doc = json.loads(Path(rec["benchmark"]["result"]).read_text())
    assert bench_doc["verdict"]["status"] == "healthy" or fell_behind(sim)
    assert bench_doc["facts"]["numa_balancing"] == 0  # read from the host after the repair
    assert len(_container_logs(sim)) == 1


def test_bench_through_pct_exec(tmp_path, capsys):
    """Container reached with `pct exec` through its (local) Proxmox host: the stdin request
    travels through pct like the real one's."""
    sim = build(tmp_path / "box", [])
    inv = _inventory(sim, tmp_path, container={"gpubox_connection": "pct"})
    rc, out, err = _bench(capsys, inv, tmp_path)
    assert rc == 0 or fell_behind(sim), err
    doc = json.loads(out)
    assert doc["verdict"]["status"] == "healthy" or fell_behind(sim)
    assert len(_container_logs(sim)) == 1
    digest = payload.build("gpubox.bench.remote").short
    assert any(
        c["argv"][:2] == ["exec", "200"]
        and c["argv"][-4:] == ["-c", payload.BOOT, "gpubox.bench.remote", digest]
        for c in sim.calls("pct")
    )


def test_a_container_without_gpubox_runs_the_benchmark(sshd, tmp_path, capsys):
    """gpubox_python as an inference server's venv has it: its libraries, no gpubox."""
    sim = build(tmp_path / "box", [])
    _bench_over_ssh(sim, sshd, tmp_path, capsys, _server_venv_python(tmp_path))
    assert len(_container_logs(sim)) == 1


def test_container_without_the_libraries_is_refused_with_the_fix(sshd, tmp_path, capsys):
    sim = build(tmp_path / "box", [])
    inv = _inventory(
        sim, tmp_path, container=sshd.vars(), host=sshd.vars(), python=_no_gpubox_python(tmp_path)
    )
    rc, out, err = _bench(capsys, inv, tmp_path)
    assert rc == 2 and json.loads(out) == {"error": err.strip(), "exit_code": 2}  # --json: the error object
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert re.search(r"No module named '(httpx|httpcore|psutil|prometheus_client|yaml)'", lines[0]), lines[0]
    assert "gpubox_python" in lines[0] and "--url" in lines[0] and "pyyaml" in lines[0]
    assert not _container_logs(sim) and not (tmp_path / "results").exists()  # nothing started or written


def test_recover_keeps_repairs_and_fails_the_bench_row(sshd, tmp_path, capsys):
    sim = build(tmp_path / "box", ["numa_balancing"])
    inv = _inventory(sim, tmp_path, container=sshd.vars(), host=sshd.vars(), python="/nonexistent/python3")
    rc, out, err = gpubox(capsys, "-i", inv, "recover", "ct200", "--yes", "--json")
    rec = json.loads(out)
    steps = {s["name"]: s for s in rec["steps"]}
    assert rc == 1
    assert steps["numa-balancing"]["status"] == "fixed"
    assert steps["bench"]["status"] == "failed"
    assert "/nonexistent/python3" in steps["bench"]["detail"] and "gpubox_python" in steps["bench"]["detail"]


def test_default_python_is_python3_and_local_runs_stay_in_process(tmp_path, capsys, monkeypatch):
    """A local container never goes through bench.remote (no probe, no subprocess)."""
    from gpubox.bench import remote

    sim = build(tmp_path / "box", [])
    inv = yaml.safe_load(sim.inventory_path.read_text())
    inv["all"]["children"]["gpu_containers"]["hosts"]["ct200"]["gpubox_bench"].update(SMALL)
    sim.inventory_path.write_text(yaml.safe_dump(inv))

    def boom(*a, **k):
        raise AssertionError("local run went through bench.remote")

    monkeypatch.setattr(remote, "run_remote", boom)
    rc, out, err = _bench(capsys, str(sim.inventory_path), tmp_path)
    assert rc == 0 or fell_behind(sim), err
    assert json.loads(out)["verdict"]["status"] == "healthy" or fell_behind(sim)
    assert not _container_logs(sim)
    assert remote.DEFAULT_PYTHON == "python3"


def test_request_carries_no_connection_secrets_and_resolves_host_facts(sshd, tmp_path):
    from gpubox.bench import remote
    from gpubox.context import Context
    from gpubox.inventory import Inventory

    sim = build(tmp_path / "box", ["numa_balancing"])
    inv = _inventory(sim, tmp_path, container=sshd.vars(), host=sshd.vars())
    ctx = Context(Inventory(inv).box("ct200"))
    try:
        settings = dict(ctx.box.var("gpubox_bench"))
        req = remote.build_request(ctx, "health", [1, 4, 8], ["auto"], settings)
    finally:
        ctx.close()
    text = json.dumps(req)
    assert str(sshd.key) not in text and "ansible_" not in text
    assert req["facts"]["numa_balancing"] == 1  # the host's live value, read on the control side
    assert req["container"]["vars"]["gpubox_connection"] == "local"
    assert "gpubox_nccl_profile" not in req["container"]["vars"]
    assert req["container"]["vars"]["gpubox_bench"]["env"]["NCCL_ALGO"] == "Ring"
    assert {g["numa_node"] for g in req["topology"]["gpus"]} == {0, 1}
    # The container side rebuilds the same GPU choice (TP4 on one NUMA node) from the request.
    from gpubox.bench.launcher import gpus_for_tp

    rctx = remote.context_from(req)
    assert gpus_for_tp(4, rctx) == [0, 1, 2, 3]
    with pytest.raises(Exception, match="not reachable from inside the container"):
        rctx.host.read_text("/proc/sys/kernel/numa_balancing")


@pytest.mark.parametrize("stdin, fragment", [("not json", "not JSON"), ('{"protocol": 99}', "protocol 99")])
def test_remote_entry_point_answers_bad_requests_with_an_error(stdin, fragment, capsys, monkeypatch):
    import io

    from gpubox.bench import remote

    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    assert remote.main() == 2
    reply = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert fragment in reply["error"]["problem"] and reply["error"]["fix"]
