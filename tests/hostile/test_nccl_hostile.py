"""Hostile NCCL values through every export format, read back by the real consumer.

A value is either refused with a one-line error, or every reader gets it back byte for byte: bash
(`set -a; . FILE`, the documented way), systemd's EnvironmentFile rules (hwtune.nccl.parse_envfile,
written from env-file.c, plus `systemd-analyze verify` where present), docker --env-file rules,
NCCL's nccl.conf reader and JSON. In no case may a sourced file run anything (a sentinel file
proves it). `gpubox nccl check` must flag a hand-written file that a shell would not read plainly.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from gpubox.errors import GpuboxError
from gpubox.hwtune import nccl
from tests.clirun import gpubox

# S is replaced by a sentinel path: if the file runs anything, the sentinel appears.
HOSTILE = [
    "eth0|touch S",
    "eth0||touch S",
    "eth0&touch S",
    "eth0;touch S",
    "$(touch S)",
    "`touch S`",
    "a$(touch S)b",
    "${X:=$(touch S)}",
    "'; touch S; '",
    '"; touch S; "',
    "it's $(touch S)",
    'a"b$(touch S)',
    "eth0>S",
    "eth0<S",
    "eth0>>S",
    "a\ntouch S",
    "a\rtouch S",
    "a\\\ntouch S",
    "x\x00touch S",
    "a\x1b[2Jb",
    "\ttab",
    " lead",
    "trail ",
    "a b",
    "*",
    "?",
    "[a]",
    "~",
    "a:~/x",
    "~root",
    "$HOME",
    "${HOME}",
    "$((1+1))",
    "!x",
    "#x",
    "a #x",
    "a;",
    "\\",
    "a\\",
    "\\$x",
    "{a,b}",
    "=eth0,^docker",
    "^lo,docker",
    "é",
    "\u2028",
    "a'b\"c`d$e\\f",
    "''",
    '""',
    "",
    "x" * 4096,
    "eth0 && touch S",
    "$(<S)",
    "<(touch S)",
    "a\u00a0b",
]


@pytest.fixture
def sentinel(tmp_path):
    return tmp_path / "RAN"


def _values(sentinel):
    return [v.replace("S", str(sentinel)) for v in HOSTILE]


def _bash_source(path) -> dict[str, str]:
    out = subprocess.run(
        ["bash", "-c", 'set -a; . "$1"; env -0', "bash", str(path)],
        capture_output=True,
        env={"PATH": os.environ["PATH"]},
        timeout=30,
        cwd=path.parent,
    ).stdout
    pairs = (item.split(b"=", 1) for item in out.split(b"\0") if b"=" in item)
    return {k.decode(): v.decode("utf-8", "surrogateescape") for k, v in pairs if k.startswith(b"NCCL_")}


READERS = {
    "shell": None,
    "envfile": nccl.parse_envfile,
    "docker": nccl.parse_docker,
    "ncclconf": nccl.parse_ncclconf,
    "json": json.loads,
}


@pytest.mark.parametrize("fmt", list(READERS))
@pytest.mark.parametrize("idx", range(len(HOSTILE)))
def test_export_is_refused_or_read_back_exactly(tmp_path, sentinel, fmt, idx):
    value = _values(sentinel)[idx]
    env = {"NCCL_DEBUG_FILE": value, "NCCL_PROTO": "Simple"}
    try:
        text = nccl.render(env, fmt, header="hostile\nheader $(touch S)".replace("S", str(sentinel)))
    except GpuboxError as exc:
        assert "\n" not in str(exc)
        return
    f = tmp_path / f"n.{fmt}"
    f.write_text(text)
    if fmt in ("shell", "envfile"):
        got = _bash_source(f)
        assert not sentinel.exists(), "DAMAGE: sourcing the export ran a command"
        assert got == env
        assert (nccl.parse_envfile if fmt == "envfile" else nccl.parse_shell)(text) == env
        assert getattr(nccl, "unsafe_lines", lambda t: [])(text) == []
    else:
        assert READERS[fmt](text) == env


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="needs systemd-analyze")
def test_systemd_accepts_every_quoted_envfile(tmp_path, sentinel):
    env = {}
    for i, v in enumerate(_values(sentinel)):
        try:
            nccl.render({"NCCL_X": v}, "envfile")
        except GpuboxError:
            continue
        env[f"NCCL_V{i}"] = v
    f = tmp_path / "all.env"
    f.write_text(nccl.render(env, "envfile"))
    unit = tmp_path / "h.service"
    unit.write_text(f"[Service]\nEnvironmentFile={f}\nExecStart=/usr/bin/env\n")
    r = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert not sentinel.exists(), "DAMAGE: sourcing the export ran a command"
    assert _bash_source(f) == env


# Hand-written files that bash would not read as a plain assignment: check must flag them.
UNSAFE_FILES = [
    "NCCL_SOCKET_IFNAME=eth0|/tmp/x.sh\n",
    "NCCL_SOCKET_IFNAME=eth0;reboot\n",
    "NCCL_DEBUG=$(id)\n",
    "NCCL_DEBUG=`id`\n",
    "NCCL_DEBUG=WARN&\n",
    "export NCCL_DEBUG=WARN >/tmp/x\n",
    "NCCL_DEBUG=a b\n",
    'NCCL_DEBUG="$(id)"\n',
    "NCCL_DEBUG='WARN' ; id\n",
    "NCCL_DEBUG=WARN\nid\n",
]


@pytest.mark.parametrize("text", UNSAFE_FILES)
def test_nccl_check_flags_shell_metacharacters(tmp_path, capsys, text):
    f = tmp_path / "n.env"
    f.write_text(text)
    rc, out, err = gpubox(capsys, "nccl", "check", str(f), "--format", "envfile")
    assert rc == 1, out + err
    assert "Traceback" not in err


def test_tune_nccl_writes_quoted_line(tmp_path):
    text = nccl.render({"NCCL_SOCKET_IFNAME": "eth0|/tmp/x.sh"}, "envfile")
    assert "NCCL_SOCKET_IFNAME='eth0|/tmp/x.sh'" in text


REAL = __import__("pathlib").Path(__file__).resolve().parent.parent / "fixtures" / "nccl" / "realworld"


@pytest.mark.parametrize(
    "name,flagged",
    [("flagai_run_multi.sh", []), ("slurm_ifname_exclude.sh", []), ("sc24_export_frontier_vars.sh", [2, 8])],
)
def test_real_files(name, flagged):
    """Real exports written by people: plain ones pass the shell-safety rule, an expansion is flagged."""
    text = (REAL / name).read_text()
    got = [no for no, _ in getattr(nccl, "unsafe_lines", lambda t: [(0, "")])(text)]
    assert got == flagged
