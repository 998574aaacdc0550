"""`gpubox report` end to end from recorded result files: LaTeX (compiled where TeX is installed),
Markdown, self-contained HTML, comparison mode, plots, missing measurements and hostile strings."""

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from gpubox.bench.report import tables as T
from gpubox.bench.report.data import load_runs
from gpubox.bench.report.latex import tex_escape
from gpubox.bench.report.markdown import md_escape
from tests.clirun import gpubox

FIX = Path(__file__).parent / "fixtures" / "results"
BEFORE, AFTER, PARTIAL = (str(FIX / f"{n}.json") for n in ("seed-before", "seed-after", "partial"))
HOSTILE = "_ % & # $ { } ~ ^ \\"
HOSTILE_BOX = json.loads(Path(PARTIAL).read_text())["box"]
HAVE_TEX = bool(shutil.which("pdflatex")) and bool(shutil.which("pdftotext"))


# --- escaping -----------------------------------------------------------------------------------


def test_tex_escape_leaves_no_active_character():
    s = tex_escape(HOSTILE + ' <x> | "q"')
    # remove every escape sequence we emit; what is left must hold no LaTeX-special character
    rest = re.sub(
        r"\\(textbackslash|textasciicircum|textasciitilde|textless|textgreater|textbar|"
        r"textquotedbl)\{\}|\\[{}$&#_%]",
        "",
        s,
    )
    assert not set(rest) & set('\\{}$&#^_~%<>|"')


def test_md_escape_escapes_every_markdown_special():
    s = md_escape("a|b *c* _d_ `e` [f](g) <h> #i ~j $k ^l &m \\n")
    for ch in "|*_`[]<>#~$^&":
        assert all(s[i - 1] == "\\" for i, c in enumerate(s) if c == ch), ch


@pytest.mark.skipif(not HAVE_TEX, reason="pdflatex/pdftotext not installed")
def test_hostile_string_typesets_verbatim(tmp_path):
    """The escaped string, compiled and read back from the PDF, is the string itself."""
    tex = tmp_path / "t.tex"  # the report's font encoding and typewriter font
    tex.write_text(
        "\\documentclass{article}\\usepackage[T1]{fontenc}\\usepackage{courier}"
        "\\pagestyle{empty}\\begin{document}\n"
        f"\\texttt{{{tex_escape(HOSTILE)}}}\n\\end{{document}}\n"
    )
    subprocess.run(
        ["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "t.tex"],
        cwd=tmp_path,
        check=True,
        capture_output=True,
        timeout=120,
    )
    text = subprocess.run(["pdftotext", "t.pdf", "-"], cwd=tmp_path, capture_output=True, text=True).stdout
    assert text.strip() == HOSTILE


# --- formats ------------------------------------------------------------------------------------


def test_markdown_report_with_plots(tmp_path, capsys):
    out = tmp_path / "md"
    rc, stdout, _ = gpubox(capsys, "report", AFTER, "--format", "md", "-o", str(out))
    assert rc == 0 and "173.4 tok/s = 4.6x auto" in stdout
    md = (out / "report.md").read_text()
    assert md.index("Summary of findings") < md.index("## Results") < md.index("Appendix: box facts")
    assert "| DDTree b15 | 173.4 | 281.1 | 263.9 |" in md
    figs = sorted(p.name for p in (out / "figures").iterdir())
    assert figs == ["acceptance.png", "concurrency.png", "context.png", "speedup.png", "tok_s_by_tp.png"]
    for p in (out / "figures").iterdir():
        data = p.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
        assert f"](figures/{p.name})" in md


def test_html_is_self_contained_and_escaped(tmp_path, capsys):
    out = tmp_path / "h"
    rc, _, _ = gpubox(capsys, "report", AFTER, PARTIAL, "--format", "html", "-o", str(out))
    assert rc == 0
    assert sorted(p.name for p in out.iterdir()) == ["figures", "report.html"]
    html = (out / "report.html").read_text()
    srcs = re.findall(r'<img src="([^"]*)"', html)
    assert srcs and all(s.startswith("data:image/png;base64,") for s in srcs)
    assert "<link" not in html and "<script" not in html
    # the hostile box name appears only escaped: & and \ kept, < > never raw from data
    assert "ct_200 #1 {lab} 50% &amp; $HOME ~x ^y \\z" in html
    assert "max_tokens 256 &gt; max_model_len 16384" in html


def test_missing_measurements_are_marked(tmp_path, capsys):
    runs = load_runs([PARTIAL])
    tp = T.tp_scaling(runs)
    assert tp.cell("DDTree b15", "TP4").status == "failed"
    assert tp.cell("DDTree b15", "TP8").status == "skipped"
    assert tp.cell("auto", "TP4").status == "missing"
    assert all(c.text not in ("0", "0.0") for r in tp.rows for c in r)
    assert any("box has 4 GPUs; TP8 needs 8" in n for n in tp.notes)
    nm = T.not_measured(runs)
    assert [r[0].text for r in nm.rows] == [
        "tp1/ddtree:15/decode/out2048",
        "tp4/ddtree:15/decode/out1024",
        "tp1/ddtree:15/long_context/ctx25000/out256",
        "tp8/ddtree:15/decode/out1024",
    ]
    out = tmp_path / "p"
    rc, _, _ = gpubox(capsys, "report", PARTIAL, "--format", "md", "-o", str(out))
    md = (out / "report.md").read_text()
    assert rc == 0 and "| DDTree b15 | 173\\.4 |" not in md  # numbers are not escaped into nonsense
    assert "| DDTree b15 | 173.4 | **failed** | *skipped* |" in md
    assert "PCIe MaxReadReq | not recorded" in md and "NUMA balancing | not recorded" in md


def test_compare_mode_side_by_side(tmp_path, capsys):
    out = tmp_path / "c"
    rc, stdout, _ = gpubox(
        capsys,
        "report",
        BEFORE,
        AFTER,
        "--compare",
        "--name",
        "before",
        "--name",
        "after",
        "--format",
        "md",
        "-o",
        str(out),
        "--json",
    )
    assert rc == 0
    doc = json.loads(stdout)
    comp = doc["comparisons"][0]
    assert comp["columns"] == ["measurement", "before", "after", "change"]
    row = next(r for r in comp["rows"] if r[0]["text"] == "TP4 DDTree b15 C=8 aggregate")
    assert [c["text"] for c in row[1:]] == ["1,072.4", "1,270.8", "+18.5%"]
    assert doc["findings"][0]["id"] == "before_after"
    assert (out / "figures" / "compare-before-after.png").stat().st_size > 10_000


def test_latex_structure_with_hostile_strings(tmp_path, capsys):
    out = tmp_path / "t"
    rc, _, _ = gpubox(capsys, "report", AFTER, PARTIAL, "-o", str(out))
    assert rc == 0
    tex = (out / "report.tex").read_text()
    assert (
        r"ct\_200 \#1 \{lab\} 50\% \& \$HOME \textasciitilde{}x \textasciicircum{}y \textbackslash{}z" in tex
    )
    assert HOSTILE_BOX not in tex
    assert r"\VAR{" not in tex and r"\BLOCK{" not in tex
    assert tex.count(r"\begin{longtable}") == tex.count(r"\end{longtable}")
    assert tex.count(r"\begin{tabular}") == tex.count(r"\end{tabular}") > 0
    for f in re.findall(r"\\includegraphics\[[^]]*\]\{([^}]*)\}", tex):
        data = (out / f).read_bytes()
        assert f.endswith(".pdf") and data[:5] == b"%PDF-" and len(data) > 5_000


@pytest.mark.skipif(not HAVE_TEX, reason="pdflatex/pdftotext not installed")
def test_pdf_compiles_and_shows_hostile_strings(tmp_path, capsys):
    out = tmp_path / "pdf"
    rc, stdout, _ = gpubox(capsys, "report", BEFORE, AFTER, PARTIAL, "--compare", "--pdf", "-o", str(out))
    assert rc == 0 and "report.pdf" in stdout
    text = subprocess.run(
        ["pdftotext", "-raw", str(out / "report.pdf"), "-"], capture_output=True, text=True
    ).stdout
    flat = " ".join(text.split())
    assert HOSTILE_BOX in flat
    assert "TP8 is 6.1% slower than TP4" in flat
    assert "NCCL_SOCKET_IFNAME=" in flat
    # nothing runs into the margin: long keys, paths and NCCL names wrap, tables fit the line
    log = (out / "report.log").read_text(errors="replace")
    assert "Overfull \\hbox" not in log, re.findall(r"Overfull \\hbox.*", log)


def test_long_words_may_break_and_wide_label_columns_wrap():
    from gpubox.bench.report.latex import colspec

    tex = tex_escape("prompt + max_model_len > /dev/shm/models/Qwen3-27B/model.safetensors")
    assert r"max\_\discretionary{}{}{}model" in tex and r"/dev/\discretionary{}{}{}shm" in tex
    assert r"a\_b" in tex_escape("a_b") and "discretionary" not in tex_escape("ct_200 a/b")

    def table(*cols):
        return T.Table("t", "t", ["a"] * len(cols), [[T.Cell.label(t) for t in cols]])

    assert str(colspec(table("partial", "tp1/ddtree:15/decode/out1024"))) == "ll"
    spec = str(colspec(table("partial", "tp1/ddtree:15/long_context/ctx25000/out256", "x" * 70)))
    widths = [float(w) for w in re.findall(r"p\{([0-9.]+)\\linewidth\}", spec)]
    assert spec.startswith("l>") and len(widths) == 2 and sum(widths) <= 0.86, spec


# --- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content,needle",
    [
        (None, "no such file"),
        ("{not json", "not valid JSON (line 1"),
        ('{"schema": "other/1", "measurements": []}', "r.json: schema: 'other/1', expected 'gpubox.bench/1'"),
        (
            '{"schema": "gpubox.bench/1", "box": "b", "run_id": "r", "started_at": "t", "verdict": '
            '{"status": "healthy"}, "measurements": [{"key": "k", "tp": 0, "label": "a", '
            '"workload": "decode", "status": "ok"}]}',
            "r.json: measurements[0].tp: a number (0), expected a whole number >= 1",
        ),
        ("[1, 2]", "r.json: top level is a list, not a result object"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys, content, needle):
    f = tmp_path / "r.json"
    if content is not None:
        f.write_text(content)
    out = tmp_path / "out"
    rc, _, err = gpubox(capsys, "report", str(f), "--format", "md", "-o", str(out))
    assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_pdf_without_tex_says_how_to_install(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)
    out = tmp_path / "o"
    rc, _, err = gpubox(capsys, "report", AFTER, "--pdf", "-o", str(out))
    assert rc == 2 and "apt-get install texlive-latex-base" in err and not out.exists()


def test_option_misuse_exit_2(tmp_path, capsys):
    rc, _, err = gpubox(capsys, "report", AFTER, "--format", "md", "--pdf", "-o", str(tmp_path / "x"))
    assert rc == 2 and "--format latex" in err
    rc, _, err = gpubox(capsys, "report", AFTER, "--compare", "-o", str(tmp_path / "y"))
    assert rc == 2 and "two or more" in err
    rc, _, err = gpubox(capsys, "report", AFTER, BEFORE, "--name", "one", "-o", str(tmp_path / "z"))
    assert rc == 2 and "one --name per result file" in err


def test_series_with_the_same_figures_are_drawn_side_by_side(tmp_path, monkeypatch):
    """Two runs of one box with identical figures: every line of a chart is still visible (each
    series dodged sideways), never one line hiding the other."""
    from gpubox.bench.report import plots

    drawn = {}

    def keep(fig, outdir, name, fmt):
        drawn[name] = [tuple(line.get_xdata()) for line in fig.axes[0].get_lines()]
        plots.plt.close(fig)
        return outdir / f"{name}.{fmt}"

    monkeypatch.setattr(plots, "_save", keep)
    runs = load_runs([AFTER, AFTER], ["a", "b"])
    plots.make_all(runs, tmp_path, "png")
    assert {"tok_s_by_tp", "concurrency", "context"} <= set(drawn)
    for name in ("tok_s_by_tp", "concurrency", "context"):
        xs = drawn[name]
        assert len(xs) >= 2 and len(set(xs)) == len(xs), (name, xs)


@pytest.mark.parametrize(
    "fmt,heading", [("md", "## Figures"), ("html", "<h2>Figures</h2>"), ("latex", r"\section{Figures}")]
)
def test_no_figures_heading_over_nothing(tmp_path, capsys, monkeypatch, fmt, heading):
    """With only the comparison chart (it sits with the comparison tables), no empty Figures section."""
    from gpubox.bench.report import plots

    monkeypatch.setattr(plots, "PLOTS", ())
    out = tmp_path / fmt
    rc, _, _ = gpubox(capsys, "report", BEFORE, AFTER, "--compare", "--format", fmt, "-o", str(out))
    assert rc == 0
    doc = next(p for p in out.iterdir() if p.name.startswith("report."))
    text = doc.read_text()
    shown = "<img" if fmt == "html" else "compare-"  # HTML carries its images inline
    assert shown in text and heading not in text
