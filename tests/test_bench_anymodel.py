"""Every OpenAI-compatible server can be measured (issue 29, point 9).

- A server whose /v1/models lists nothing (transformers serve 5.17 serving a local directory,
  read on the H200 device machine 2026-12-01; simulated here by the simulator's
  `--models-list empty`): `bench run --url` says to name the model, `--model` measures it, and
  the launcher calls such a server ready only once a request for the named model works.
- A launched server dies with gpubox, even when gpubox is killed with SIGKILL (process group +
  PR_SET_PDEATHSIG): a real parent process, a real SIGKILL, a real server.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from gpubox.bench.launcher import LaunchError, Server, free_port
from tests.clirun import gpubox

ROOT = Path(__file__).resolve().parent.parent
MODEL = "/models/local-dir"


def _sim_argv(port: int, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "gpubox.simbox.simserver",
        "--port",
        str(port),
        "--model",
        MODEL,
        "--startup-s",
        "0",
        "--speed",
        "50",
        *extra,
    ]


@pytest.fixture()
def env_path(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def test_empty_model_list_is_ready_only_once_the_named_model_answers(tmp_path, env_path):
    port = free_port()
    srv = Server(
        _sim_argv(port, "--models-list", "empty", "--loading-requests", "3"),
        {},
        port=port,
        log_path=tmp_path / "s.log",
        model=MODEL,
    )
    srv.start()
    try:
        srv.wait_ready(120)
        import httpx

        # ready means: the 3 "loading" answers are used up and a request for the model works now
        r = httpx.post(
            srv.url + "/v1/completions", json={"model": MODEL, "prompt": "a b", "max_tokens": 2}, timeout=30
        )
        assert r.status_code == 200
        assert httpx.get(srv.url + "/v1/models", timeout=5).json()["data"] == []
    finally:
        srv.stop()


def test_empty_model_list_without_a_name_fails_at_once_with_the_fix(tmp_path, env_path):
    port = free_port()
    srv = Server(_sim_argv(port, "--models-list", "empty"), {}, port=port, log_path=tmp_path / "s.log")
    srv.start()
    try:
        with pytest.raises(LaunchError) as ei:
            srv.wait_ready(120)
        assert "lists no model" in ei.value.problem and "gpubox_bench.model" in ei.value.fix
    finally:
        srv.stop()


def test_bench_run_names_the_model(tmp_path, capsys, env_path, monkeypatch):
    monkeypatch.setenv("GPUBOX_STATE_DIR", str(tmp_path / "state"))
    port = free_port()
    prof = tmp_path / "p.yml"
    prof.write_text(
        json.dumps(
            {
                "warmup": 0,
                "repetitions": 1,
                "prompt_tokens": 16,
                "workloads": [{"kind": "decode", "output_lens": [8]}],
            }
        )
    )
    with Server(
        _sim_argv(port, "--models-list", "empty"), {}, port=port, log_path=tmp_path / "s.log", model=MODEL
    ) as srv:
        srv.start()
        srv.wait_ready(120)
        base = ["bench", "run", "--url", srv.url, "--profile-file", prof, "--out", tmp_path / "r", "--json"]
        rc, out, err = gpubox(capsys, *base)
        assert rc == 2 and "lists no model" in err and "--model NAME" in err
        assert len(err.strip().splitlines()) == 1
        rc, out, err = gpubox(capsys, *base, "--model", "/models/other")
        doc = json.loads(out)
        assert rc == 1 and doc["measurements"][0]["status"] == "failed"  # the server refuses that name
        rc, out, err = gpubox(capsys, *base, "--model", MODEL)
        doc = json.loads(out)
        assert rc == 0, err
        assert doc["servers"][0]["model"] == MODEL and doc["measurements"][0]["status"] == "ok"
        assert any("lists no model" in n for n in doc["servers"][0]["client"].get("notes", []))


PARENT = r"""
import sys, time
from gpubox.bench.launcher import Server, free_port
port = free_port()
argv = [sys.executable, "-m", "gpubox.simbox.simserver", "--port", str(port), "--startup-s", "0"]
s = Server(argv, {}, port=port, log_path=sys.argv[1])
s.start()
s.wait_ready(120)
print(s.proc.pid, flush=True)
time.sleep(600)
"""


def test_launched_server_dies_when_gpubox_is_killed(tmp_path, env_path):
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(tmp_path / "s.log")], stdout=subprocess.PIPE, text=True
    )
    try:
        line = parent.stdout.readline()
        assert line.strip().isdigit(), (
            (tmp_path / "s.log").read_text() if (tmp_path / "s.log").exists() else line
        )
        server = psutil.Process(int(line))
        assert server.is_running() and server.ppid() == parent.pid
        assert os.getpgid(server.pid) == server.pid != os.getpgid(parent.pid)  # its own group: no Ctrl-C
        parent.send_signal(signal.SIGKILL)  # no finally, no atexit: only the kernel can act
        parent.wait(timeout=30)
        # the kernel sends the server SIGTERM as its parent dies; wait for it to be gone
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if server.status() == psutil.STATUS_ZOMBIE:
                    break
            except psutil.NoSuchProcess:
                break
            time.sleep(0.1)
        assert not server.is_running() or server.status() == psutil.STATUS_ZOMBIE
    finally:
        if parent.poll() is None:
            parent.kill()
        try:
            server.kill()
        except Exception:
            pass
