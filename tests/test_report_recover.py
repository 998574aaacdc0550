"""Reports (issue 29, point 7): commands typeset verbatim in the PDF (`--` stays two hyphens), and
recover's report lists each repair with the values it set, MaxReadReq as read back after it."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from gpubox.bench.report.latex import tex_escape
from gpubox.simbox import build
from tests.clirun import gpubox

FIX = Path(__file__).parent / "fixtures" / "results"
HAVE_TEX = bool(shutil.which("pdflatex")) and bool(shutil.which("pdftotext"))


def test_tex_escape_breaks_every_ligature():
    assert tex_escape("--tensor-parallel-size") == "-{}-{}tensor-{}parallel-{}size"
    assert "''" not in tex_escape("a''b") and "``" not in tex_escape("``q``")
    assert ",," not in tex_escape("a,,b")


@pytest.mark.skipif(not HAVE_TEX, reason="pdflatex/pdftotext not installed")
def test_pdf_shows_server_commands_verbatim(tmp_path, capsys):
    out = tmp_path / "pdf"
    rc, stdout, _ = gpubox(capsys, "report", FIX / "seed-after.json", "--pdf", "-o", out)
    assert rc == 0
    text = subprocess.run(
        ["pdftotext", "-raw", str(out / "report.pdf"), "-"], capture_output=True, text=True, timeout=60
    ).stdout
    assert "--tensor-parallel-size" in text and "\u2013tensor" not in text


def test_recover_report_lists_each_repair_and_the_values_set(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("GPUBOX_STATE_DIR", str(tmp_path / "state"))
    sim = build(tmp_path / "box", ["uvm_missing", "uvm_stale_major", "mrrs_512", "numa_balancing"], gpus=2)
    inv = yaml.safe_load(sim.inventory_path.read_text())
    b = inv["all"]["children"]["gpu_containers"]["hosts"]["ct200"]["gpubox_bench"]
    b.update(tp=[1], methods=["auto"])
    sim.inventory_path.write_text(yaml.safe_dump(inv, sort_keys=False))
    rc, out, err = gpubox(
        capsys, "-i", sim.inventory_path, "recover", "ct200", "--yes", "--out", tmp_path / "r", "--json"
    )
    doc = json.loads(out)
    assert doc["benchmark"] is not None, err
    result = json.loads(Path(doc["benchmark"]["result"]).read_text())
    fixed = {s["name"] for s in doc["steps"] if s["changed"]}
    assert (
        {r["step"] for r in result["repairs"]} == fixed >= {"host-devices", "container-config", "pcie-mrrs"}
    )
    md = Path(doc["benchmark"]["report"]).read_text()
    assert "repair: pcie-mrrs" in md and "MaxReadReq 512 -\\> 4096" in md
    assert "repair: container-config" in md and "511" in md
    assert "| PCIe MaxReadReq | 4096 bytes on all 2 GPUs |" in md  # read back, not "not recorded"
