"""One escape per output path, applied at the boundary: a result document whose every string field
carries an escape sequence, an OSC title, a C1 CSI, a bidi override (U+202E) and rich markup goes
through every renderer (advise text/md/html/latex, report md/html/latex, the Prometheus textfile,
the history table); none of them lets a raw control character through, and none ends with an
internal error. The terminal boundary itself (gpubox.output.OutputConsole) is checked with a
table built without `plain()`, as a new field that forgot it would be."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.clirun import gpubox

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "results" / "seed-after.json"
EVIL = "E\x1b[31m\x1b]0;T\x07\u202eR[/bold][red]x\x9b2J"
RAW = ("\x1b", "\u202e", "\x9b", "\x07")
KEEP = {"schema", "workload", "status", "started_at", "finished_at", "method"}


def _poison(o):
    if isinstance(o, dict):
        return {k: (v if k in KEEP else _poison(v)) for k, v in o.items()}
    if isinstance(o, list):
        return [_poison(x) for x in o]
    return o + EVIL if isinstance(o, str) else o


@pytest.fixture(scope="module")
def evil(tmp_path_factory):
    doc = _poison(json.loads(FIX.read_text()))
    p = tmp_path_factory.mktemp("evil") / "evil.json"
    p.write_text(json.dumps(doc))
    return p


def _clean(text: str, where: str) -> None:
    found = [repr(c) for c in RAW if c in text]
    assert not found, f"DAMAGE: raw {found} reached {where}"


@pytest.mark.parametrize("fmt", ["text", "md", "html", "latex"])
def test_advise_escapes_every_field(capsys, evil, fmt):
    rc, out, err = gpubox(capsys, "advise", evil, "--format", fmt, "--no-history")
    assert rc in (0, 1), err
    assert "internal error" not in err
    _clean(out + err, f"advise --format {fmt}")
    if fmt != "latex":  # LaTeX shows it through its own escaper
        assert "\\u202e" in out  # shown, not dropped


@pytest.mark.parametrize("fmt, name", [("md", "report.md"), ("html", "report.html"), ("latex", "report.tex")])
def test_report_escapes_every_field(capsys, evil, tmp_path, fmt, name):
    rc, out, err = gpubox(capsys, "report", evil, "--format", fmt, "-o", tmp_path / "r")
    assert rc == 0, err
    _clean(out + err, "report's terminal output")
    _clean((tmp_path / "r" / name).read_text(errors="replace"), name)


def test_prometheus_labels_escaped(evil):
    from gpubox.bench import prom

    text = prom.render(json.loads(evil.read_text()))
    _clean(text, "the Prometheus textfile")
    assert "\\\\u202e" in text or "\\u202e" in text


def test_history_table_escapes_headers_and_cells(capsys, evil, tmp_path, monkeypatch):
    from gpubox.bench import history

    monkeypatch.setenv("GPUBOX_STATE_DIR", str(tmp_path / "state"))
    doc = json.loads(evil.read_text())
    history.record(doc)
    inv = tmp_path / "hosts.yml"
    inv.write_text(
        "all:\n  children:\n    proxmox_hosts:\n      hosts:\n        pve1: {ansible_connection: local}\n"
        f"    gpu_containers:\n      hosts:\n        {json.dumps(doc['box'])}: "
        "{gpubox_vmid: 200, gpubox_proxmox_host: pve1}\n"
    )
    rc, out, err = gpubox(capsys, "-i", inv, "history", doc["box"])
    assert "internal error" not in err
    _clean(out + err, "gpubox history")


def test_console_boundary_escapes_what_a_caller_forgot(capsys):
    from rich.table import Table

    from gpubox.output import console

    t = Table(title="t" + EVIL)
    t.add_column("head" + EVIL)  # no plain(): the boundary must still escape it
    t.add_row("cell" + EVIL)
    con = console()
    con.print(t)
    con.print("reason: " + EVIL)  # a markup string with a broken tag: printed as written
    out = capsys.readouterr().out
    _clean(out, "the console")
    assert "[/bold]" in out and "\\x1b" in out
