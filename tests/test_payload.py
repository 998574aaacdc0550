"""The one payload runner (gpubox.transport.payload): every entry run for real with the system's
python3 in isolated mode (-I: no gpubox, no PYTHONPATH, no user site), through the local
transport and through a real sshd; the same answers as the module run as a plain script; nothing
written on the box, a killed run included; argv elements kept whole (no shell)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gpubox.transport import payload
from gpubox.transport.local import LocalTransport

BARE = "/usr/bin/python3"  # the system python3: what a container has
REPO = Path(__file__).resolve().parent.parent
STAGE = "gpubox.provision.stage.__main__"  # the copier's payload entry


def _bare_python() -> str:
    if not os.path.exists(BARE):
        pytest.skip(f"{BARE} is not installed")
    r = subprocess.run([BARE, "-I", "-c", "import gpubox"], capture_output=True, text=True, timeout=60)
    if r.returncode == 0:
        pytest.skip(f"{BARE} can import gpubox: not a python without gpubox")
    return BARE


def _has(python: str, module: str) -> bool:
    return (
        subprocess.run([python, "-I", "-c", f"import {module}"], capture_output=True, timeout=60).returncode
        == 0
    )


def _run(entry, args=(), input=None, transport=None, python=None, timeout=120):
    return payload.run(
        transport or LocalTransport(),
        entry,
        args,
        python=python or _bare_python(),
        input=input,
        timeout=timeout,
        flags=["-I"],
    )


def test_the_payload_is_deterministic_and_its_digest_is_in_the_argv():
    a, b = payload.build(STAGE), payload.modules_of(STAGE)
    assert a.digest == hashlib.sha256(a.zip).hexdigest() and set(a.modules) == set(b)
    payload.build.cache_clear()
    again = payload.build(STAGE)
    assert again.zip == a.zip and again is not a  # rebuilt, the same bytes: a dry run shows apply's digest
    argv = again.argv("python3", ["--request", "{}"])
    assert argv == ["python3", "-c", payload.BOOT, STAGE, a.digest[:16], "--request", "{}"]
    assert a.digest[:16] in again.describe() and "gpubox.provision.safetensors_check" in again.describe()
    files, rest = payload.unpack(again.stdin(b"tail"))
    assert rest == b"tail" and files[STAGE] == (REPO / "provision/stage/__main__.py").read_bytes()


def test_cuda_probe_answers_as_the_plain_script_and_keeps_argv_whole(tmp_path):
    python = _bare_python()
    odd = str(tmp_path / "a b;$(touch x)'\"")
    r = _run("gpubox.provision.cuda_probe", [odd])
    assert r.rc == 0, r.stderr
    plain = subprocess.run(
        [python, "-I", str(REPO / "provision/cuda_probe.py"), odd], capture_output=True, text=True, timeout=60
    )
    assert json.loads(r.stdout) == json.loads(plain.stdout)
    doc = json.loads(r.stdout)
    assert doc["simulated"] is False and doc["nodes"][odd] == "ENOENT"
    assert not (Path.cwd() / "x").exists() and not (tmp_path / "x").exists()


def test_nvml_probe_answers_as_the_plain_script():
    python = _bare_python()
    r = _run("gpubox.hwtune.nvml_probe")
    plain = subprocess.run(
        [python, "-I", str(REPO / "hwtune/nvml_probe.py")], capture_output=True, text=True, timeout=60
    )
    assert (r.rc, json.loads(r.stdout)) == (plain.returncode, json.loads(plain.stdout))
    if not _has(python, "pynvml"):
        assert r.rc == 3 and "pynvml" in json.loads(r.stdout)["unavailable"]


def test_gpu_probe_runs_and_its_bad_options_exit_2():
    r = _run("gpubox.hwtune.probe", ["--quick", "--no-bandwidth"])
    assert r.rc == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema"].startswith("gpubox.probe/")
    r = _run("gpubox.hwtune.probe", ["--bogus"])
    assert r.rc == 2 and "--bogus" in r.stderr


def test_the_copier_stages_and_checks_with_the_stdlib_alone(tmp_path):
    python = _bare_python()
    from gpubox.simbox.model import make_model  # test data only: the payload holds no simulator

    src, dest = tmp_path / "persistent" / "M", tmp_path / "shm" / "M"
    make_model(src, [200_000, 100_000], seed=3)
    req = {"op": "stage", "src": str(src), "dest": str(dest), "workers": 2}
    r = _run(STAGE, ["--request", json.dumps(req)])
    assert r.rc == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["copied"] == len(list(src.iterdir()))
    man = json.loads((dest / ".gpubox-manifest.json").read_text())
    algo = "xxh3-tree-64MiB" if _has(python, "xxhash") else "crc32-tree-64MiB"  # xxhash is optional there
    assert {e["algo"] for e in man["files"].values()} == {algo}
    r = _run(STAGE, ["--request", json.dumps({**req, "op": "check"})])
    assert r.rc == 0 and json.loads(r.stdout)["staged"] is True
    r = _run(STAGE, ["--request", json.dumps({**req, "src": str(tmp_path / "nope")})])
    assert r.rc == 2 and "is not a directory" in json.loads(r.stdout)["error"]


def test_hf_snapshot_needs_huggingface_hub_there_as_before():
    python = _bare_python()
    args = [json.dumps({"repo": "org/none", "revision": None, "cache_dir": None, "local_only": True})]
    r = _run("gpubox.provision.hf_snapshot", args)
    if _has(python, "huggingface_hub"):
        assert r.rc == 3 and "error" in json.loads(r.stdout)
    else:
        assert r.rc == 1 and "No module named 'huggingface_hub'" in r.stderr


def test_the_bench_side_reads_its_request_after_the_zip_and_checks_its_libraries():
    python = _bare_python()
    r = _run("gpubox.bench.remote", input="not json")
    assert r.rc == 2, r.stderr
    assert "not JSON" in json.loads(r.stdout.strip().splitlines()[-1])["error"]["problem"]
    r = _run("gpubox.bench.remote", ["--check"])
    if all(_has(python, m) for m in ("httpx", "psutil", "prometheus_client", "yaml")):
        assert r.rc == 0, r.stderr
    else:
        assert r.rc == 1 and "No module named" in r.stderr.strip().splitlines()[-1]


def test_nothing_is_written_on_the_box_even_when_the_run_is_killed(tmp_path):
    """The zip is served from memory: no temporary file, so SIGKILL leaves nothing behind."""
    python = _bare_python()
    tmp, cwd = tmp_path / "tmp", tmp_path / "cwd"
    tmp.mkdir()
    cwd.mkdir()
    env = {"PATH": "/usr/bin:/bin", "TMPDIR": str(tmp), "HOME": str(cwd)}
    p = payload.build("gpubox.bench.remote")
    proc = subprocess.Popen(
        p.argv(python, flags=["-I", "-v"]),  # -v: each import on stderr, so we know how far it got
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd=cwd,
        env=env,
    )
    proc.stdin.write(p.stdin())  # the zip, then the request never comes: it waits on stdin
    proc.stdin.flush()
    for line in proc.stderr:  # the entry's own import: the zip is loaded and the entry is running
        if line.startswith(b"import 'gpubox.errors'"):
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    proc.stdin.close()
    proc.stderr.close()
    assert list(tmp.iterdir()) == [] and list(cwd.iterdir()) == []
    # and a run to its end too
    r = subprocess.run(
        p.argv(python, flags=["-I"]), input=p.stdin(b"nope"), cwd=cwd, env=env, capture_output=True
    )
    assert r.returncode == 2 and list(tmp.iterdir()) == [] and list(cwd.iterdir()) == []


def test_over_real_ssh(sshd):
    """The same payloads through the SSH transport (argv quoted element by element, the zip on the
    channel's stdin), with the sshd host's system python3."""
    python = _bare_python()
    t = sshd.transport("pve1")
    try:
        r = _run("gpubox.provision.cuda_probe", ["/dev/x y"], transport=t, python=python)
        assert r.rc == 0, r.stderr
        assert json.loads(r.stdout)["nodes"]["/dev/x y"] == "ENOENT"
        r = _run("gpubox.bench.remote", input="{", transport=t, python=python)
        assert r.rc == 2 and "not JSON" in r.stdout
    finally:
        t.close()


def test_hf_snapshot_over_ssh_finds_the_cached_snapshot_as_in_process(sshd, tmp_path):
    """With huggingface_hub there (this venv's python, whose site-packages has it), the payload
    answers the snapshot path snapshot_download gives in-process, offline."""
    from huggingface_hub import snapshot_download

    rev = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hf" / "models--org--Tiny"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(rev)
    (repo / "snapshots" / rev).mkdir(parents=True)
    (repo / "snapshots" / rev / "config.json").write_text("{}")
    args = {"repo": "org/Tiny", "revision": None, "cache_dir": str(tmp_path / "hf"), "local_only": True}
    want = snapshot_download("org/Tiny", cache_dir=args["cache_dir"], local_files_only=True)
    t = sshd.transport("ct")
    try:
        r = payload.run(t, "gpubox.provision.hf_snapshot", [json.dumps(args)], python=sys.executable)
        assert (r.rc, r.stdout.strip()) == (0, want), r.stderr
        r = payload.run(
            t,
            "gpubox.provision.hf_snapshot",
            [json.dumps({**args, "repo": "org/Absent"})],
            python=sys.executable,
        )
        assert r.rc == 3 and "error" in json.loads(r.stdout)
    finally:
        t.close()


def test_a_missing_interpreter_is_rc_127_as_before():
    r = payload.run(LocalTransport(), "gpubox.provision.cuda_probe", python="/nonexistent/python3")
    assert r.rc == 127


@pytest.mark.skipif(shutil.which("python3") is None, reason="no python3 on PATH")
def test_the_runner_prints_each_entry_and_its_size():
    r = subprocess.run(
        [sys.executable, "-m", "gpubox.transport.payload"], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    rows = {line.split()[0]: line.split()[1:] for line in r.stdout.splitlines()[1:]}
    assert set(rows) == set(payload.ENTRIES)
    # the same payloads as gpubox ships (run as __main__, the runner still leaves itself out)
    assert {e: int(r[0]) for e, r in rows.items()} == {e: len(payload.build(e).modules) for e in rows}
    assert {e: int(r[2]) for e, r in rows.items()} == {e: len(payload.build(e).zip) for e in rows}
    assert int(rows[STAGE][0]) == 24  # the copier's package + gpubox.errors and gpubox.safepath


def test_the_loader_is_python_3_6_grammar():
    """The loader runs first on the box, whatever its python3 (>= 3.6, Ubuntu 18.04's): no syntax
    newer than that, so an old interpreter fails in the entry with its own error, not in the loader."""
    import ast

    src = payload.LOADER.read_text()
    ast.parse(src, feature_version=(3, 6))
    assert "f'" not in src and 'f"' not in src and ":=" not in src
    with pytest.raises(SyntaxError):  # the check finds what it forbids
        ast.parse("if (n := 1):\n    pass\n", feature_version=(3, 6))
