"""Launcher: exact argv for every preset (checked against the real tools' flags recorded from their
sources), custom templates, port-in-use detection, crash-on-start with the log tail, and
process-group teardown that leaves no process behind."""

import json
import socket
import sys
from pathlib import Path

import psutil
import pytest

from gpubox.bench.launcher import (
    LaunchError,
    Server,
    ServerSpec,
    build_command,
    free_port,
    parse_method,
    port_in_use,
)
from gpubox.errors import GpuboxError
from tests.bench_helpers import simserver

FLAGS = json.loads((Path(__file__).parent / "data" / "bench_flags.json").read_text())
M, D = "/dev/shm/Qwen3.6-27B", "/dev/shm/Qwen3.6-27B-DFlash"


def spec(engine, method, budget=None, tp=4, **kw):
    return ServerSpec(
        engine=engine,
        method=method,
        budget=budget,
        tp=tp,
        port=8000,
        model=M,
        drafter=D,
        max_model_len=131072,
        gpus=[0, 1, 2, 3][:tp] if tp <= 4 else list(range(tp)),
        **kw,
    )


def flags_of(argv):
    return [a for a in argv if a.startswith("--")]


def value(argv, flag):
    return argv[argv.index(flag) + 1]


@pytest.mark.parametrize("method,budget", [("auto", None), ("linear", 15), ("ddtree", 15), ("ddtree", 64)])
def test_vllm_presets_use_only_real_flags(method, budget):
    argv, env = build_command(spec("vllm", method, budget))
    known = set(FLAGS["vllm"]["value_flags"])
    assert argv[:3] == ["vllm", "serve", M]
    assert set(flags_of(argv)) <= known, set(flags_of(argv)) - known
    assert value(argv, "--tensor-parallel-size") == "4"
    assert value(argv, "--port") == "8000"
    assert value(argv, "--max-model-len") == "131072"
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
    if method == "auto":
        assert "--speculative-config" not in argv
    else:
        cfg = json.loads(value(argv, "--speculative-config"))
        assert set(cfg) == set(FLAGS["vllm"]["speculative_config_keys"])
        assert cfg == {
            "method": "dflash" if method == "linear" else "ddtree",
            "model": D,
            "num_speculative_tokens": budget,
        }
    assert ("--attention-backend" in argv) == (method == "ddtree")
    if method == "ddtree":
        assert value(argv, "--attention-backend") == "TREE_ATTN"


def test_vllm_ddtree_env_backend_for_older_vllm():
    argv, env = build_command(spec("vllm", "ddtree", 15, attention="env"))
    assert "--attention-backend" not in argv
    assert env["VLLM_ATTENTION_BACKEND"] == "TREE_ATTN"
    assert "VLLM_ATTENTION_BACKEND" in FLAGS["vllm"]["env"]


@pytest.mark.parametrize(
    "method,algo,budget_flag",
    [
        ("linear", "DFLASH", "--speculative-num-draft-tokens"),
        ("ddtree", "DDTREE", "--speculative-ddtree-budget"),
        ("auto", None, None),
    ],
)
def test_sglang_presets_use_only_real_flags(method, algo, budget_flag):
    argv, env = build_command(spec("sglang", method, 15 if algo else None, tp=8))
    assert argv[:3] == ["python3", "-m", FLAGS["sglang"]["module"]]
    assert set(flags_of(argv)) <= set(FLAGS["sglang"]["value_flags"])
    assert value(argv, "--tp-size") == "8" and value(argv, "--model-path") == M
    assert value(argv, "--context-length") == "131072"
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"
    if algo:
        assert value(argv, "--speculative-algorithm") == algo in FLAGS["sglang"]["speculative_algorithms"]
        assert value(argv, "--speculative-draft-model-path") == D
        assert value(argv, budget_flag) == "15"
    else:
        assert "--speculative-algorithm" not in argv


def test_custom_template_substitutes_per_element_and_cannot_inject():
    s = spec(
        "custom", "ddtree", 32, tp=4, template="my-server --m {model} --port {port} --gpus {gpus} -b {budget}"
    )
    s.model = "/m; rm -rf /"  # a hostile value stays one argv element
    argv, _ = build_command(s)
    assert argv == ["my-server", "--m", "/m; rm -rf /", "--port", "8000", "--gpus", "0,1,2,3", "-b", "32"]
    s.template = ["srv", "{nope}"]
    with pytest.raises(GpuboxError, match="placeholder"):
        build_command(s)


def test_speculative_methods_need_a_drafter_and_methods_parse():
    s = spec("vllm", "ddtree", 15)
    s.drafter = None
    with pytest.raises(GpuboxError, match="drafter"):
        build_command(s)
    assert parse_method("ddtree:64") == ("ddtree", 64, "ddtree:64")
    assert parse_method("dflash") == ("linear", 15, "linear:15")
    for bad in ("tree", "ddtree:x", "auto:3", "ddtree:0"):
        with pytest.raises(GpuboxError):
            parse_method(bad)


def test_port_in_use_is_found_before_start(tmp_path):
    with simserver(tmp_path) as s:
        assert port_in_use("127.0.0.1", s.port)
        other = Server([sys.executable, "-c", "pass"], {}, port=s.port, log_path=tmp_path / "x.log")
        with pytest.raises(LaunchError, match="already in use"):
            other.start()
        assert other.proc is None  # nothing was started
    assert not port_in_use("127.0.0.1", s.port)


def test_port_free_again_while_previous_connections_wait(tmp_path):
    """A server that closed its connections first leaves them in TIME_WAIT on its port; the next
    server (which binds with SO_REUSEADDR, as uvicorn, vLLM and llama-server do) starts fine, so
    the launcher must not call the port in use (seen in benchmarks/interop.py after transformers
    serve: every later server was refused)."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    port = srv.getsockname()[1]
    cli = socket.create_connection(("127.0.0.1", port))
    conn, _ = srv.accept()
    conn.close()  # the server closes first: TIME_WAIT on 127.0.0.1:port
    cli.recv(1)
    cli.close()
    srv.close()
    tcp = Path("/proc/net/tcp").read_text().splitlines()[1:]  # read only: state 06 is TIME_WAIT
    assert any(ln.split()[1].endswith(f":{port:04X}") and ln.split()[3] == "06" for ln in tcp)
    assert not port_in_use("127.0.0.1", port)
    again = Server(
        [sys.executable, "-m", "gpubox.simbox.simserver", "--port", str(port)],
        {},
        port=port,
        log_path=tmp_path / "again.log",
    )
    again.start()
    try:
        again.wait_ready(timeout=30)
        assert port_in_use("127.0.0.1", port)  # a listener still counts
    finally:
        again.stop()


def test_crash_during_start_reports_log_tail(tmp_path):
    port = free_port()
    s = Server(
        [sys.executable, "-m", "gpubox.simbox.simserver", "--port", str(port), "--fail-start"],
        {},
        port=port,
        log_path=tmp_path / "srv.log",
    )
    s.start()
    with pytest.raises(LaunchError) as ei:
        s.wait_ready(timeout=20)
    s.stop()
    assert "exited with status 1 during start-up" in ei.value.problem
    assert "Engine core initialization failed" in ei.value.log_tail


def test_not_ready_in_time(tmp_path):
    port = free_port()
    s = Server(
        [sys.executable, "-c", "import time; time.sleep(30)"], {}, port=port, log_path=tmp_path / "s.log"
    )
    s.start()
    with pytest.raises(LaunchError, match="not ready after"):
        s.wait_ready(timeout=0.5)
    s.stop()
    assert s.proc.poll() is not None


def test_teardown_kills_whole_group_and_escaped_children(tmp_path):
    # the server spawns a worker child (like vLLM's EngineCore); plus one that left the group via setsid
    with simserver(tmp_path, "--spawn-child") as s:
        parent = psutil.Process(s.proc.pid)
        kids = parent.children(recursive=True)
        assert kids, "the simulator should have a worker child"
        escaped = psutil.Popen([sys.executable, "-c", "import os,time; os.setsid(); time.sleep(60)"])
        s._seen[escaped.pid] = escaped  # as if it were a descendant seen while the server ran
        pids = [parent.pid, *[k.pid for k in kids], escaped.pid]
    alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert alive == []
    escaped.wait(timeout=5)
