"""The wheel users install: one import name (`gpubox`, with gpubox.bench / gpubox.provision /
gpubox.hwtune), every module and data file of those folders, and nothing else: no benchmarks/,
no tests, no generic top-level names (bench, provision, hwtune) taken from other software."""

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("gpubox", "bench", "provision", "hwtune")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """Built like the install role builds it: `pip wheel --no-build-isolation` on a copy of the
    checkout (as a clone has it), with this interpreter's setuptools."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(
        ROOT,
        src,
        symlinks=True,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", "venv", "build", "dist", "*.egg-info", "__pycache__", "results", ".whl"
        ),
    )
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--disable-pip-version-check",
            "-w",
            str(tmp / "out"),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    (whl,) = (tmp / "out").glob("gpubox-*.whl")
    return whl


def _tracked(folder: str) -> list[str]:
    out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "--", folder], capture_output=True, text=True)
    files = (
        out.stdout.split()
        if out.returncode == 0
        else [str(p.relative_to(ROOT)) for p in (ROOT / folder).rglob("*") if p.is_file()]
    )
    return [f for f in files if not (ROOT / f).is_symlink()]


def test_one_top_level_name(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"gpubox", wheel.name.split("-py")[0] + ".dist-info"}, tops
    info = next(n for n in names if n.endswith("top_level.txt"))
    assert zipfile.ZipFile(wheel).read(info).decode().split() == ["gpubox"]


def test_every_module_and_data_file_is_in_it_under_gpubox(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for folder in FOLDERS:
        for f in _tracked(folder):
            want = f if folder == "gpubox" else f"gpubox/{f}"
            assert want in names, f"{f} missing from the wheel (as {want})"
    assert not any(
        n.startswith(("gpubox/benchmarks", "gpubox/tests", "tests/", "benchmarks/")) for n in names
    )


def _isolated(code: str, target, cwd):
    """CODE run by this python with -I -S (no site-packages: not this machine's editable
    installs, no cwd), TARGET (the installed wheel) first on sys.path; it must exit 0."""
    r = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code, str(target)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return r


def test_installed_wheel_imports_as_gpubox_only(wheel, tmp_path):
    target = tmp_path / "site"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-compile",
            "--disable-pip-version-check",
            "--target",
            str(target),
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    # -I -S: no site-packages (this machine's editable installs), no cwd, only the installed wheel.
    code = (
        "import sys, importlib.util as u; sys.path.insert(0, sys.argv[1])\n"
        "import gpubox.bench.remote, gpubox.provision.stage, gpubox.progress\n"
        "assert gpubox.bench.remote.__file__.startswith(sys.argv[1]), gpubox.bench.remote.__file__\n"
        "print([n for n in ('bench', 'provision', 'hwtune', 'benchmarks', 'tests') if u.find_spec(n)])\n"
    )
    r = _isolated(code, target, tmp_path)
    assert r.stdout.strip() == "[]"
    # The payloads gpubox runs on a box come out of the wheel byte for byte as out of the checkout
    # (the same modules found through the wheel's gpubox/bench/... as through package-dir).
    from gpubox.transport import payload

    want = {e: payload.build(e).digest for e in payload.ENTRIES}
    code = (
        "import sys, json; sys.path.insert(0, sys.argv[1])\n"
        "from gpubox.transport import payload\n"
        "assert payload.__file__.startswith(sys.argv[1]), payload.__file__\n"
        "print(json.dumps({e: payload.build(e).digest for e in payload.ENTRIES}))\n"
    )
    r = _isolated(code, target, tmp_path)
    assert json.loads(r.stdout) == want


def test_no_module_in_the_wheel_imports_the_old_top_level_names(wheel):
    """After the folders became gpubox.*, an `import` of the old names would only work from a checkout."""
    import re

    old = "|".join(("bench", "provision", "hwtune"))
    pat = re.compile(
        r"^\s*(?:from|import)\s+(?:" + old + r")\b|['\"]-m['\"],\s*['\"](?:" + old + r")\.|"
        r"['\"](?:" + old + r")\.[a-z_]+:",
        re.M,
    )
    z = zipfile.ZipFile(wheel)
    bad = [
        f"{n}: {m.group(0).strip()}"
        for n in z.namelist()
        if n.endswith(".py")
        for m in pat.finditer(z.read(n).decode())
    ]
    assert bad == []


def test_installed_wheel_finds_every_step_provider_without_the_old_names(wheel, tmp_path):
    """A checkout masks a forgotten old name (the folders are importable from it); an installed wheel
    does not. Every module of the pipeline (gpubox.areas.PIPELINE) must import from the wheel with the old
    names blocked."""
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-compile",
            "--disable-pip-version-check",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    code = (
        "import sys, importlib, importlib.abc\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('bench', 'provision', 'hwtune'):\n"
        "            raise ModuleNotFoundError(f'old top-level name imported: {name}', name=name)\n"
        "sys.meta_path.insert(0, Block()); sys.path.insert(0, sys.argv[1])\n"
        "import gpubox.provision.recover, gpubox.areas as r, gpubox.cli as c\n"
        "for m in r.PIPELINE: importlib.import_module(m)\n"
        "for t in c.COMMANDS.values(): importlib.import_module(t.split(':')[0])\n"
        "print(len(r.PIPELINE), len(c.COMMANDS))\n"
    )
    r = subprocess.run(
        [sys.executable, "-I", "-c", code, str(target)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr[-2000:]


def test_every_package_folder_is_listed_in_pyproject():
    """package-dir maps gpubox.bench -> bench/ etc.; `packages` must then name every subpackage (a
    folder left out would be missing from the wheel but still import from a checkout)."""
    import tomllib

    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = {"gpubox.bench.report.templates"}  # the report templates: data only, listed on purpose
    for pkg, folder in cfg["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join((pkg, *rel)))
    assert set(cfg["packages"]) == found


def test_the_checkout_has_no_symlinks():
    """The area folders map through package-dir and the Ansible collection is a real folder: a
    clone on any filesystem (or a zip of it) has the same tree."""
    out = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-s"], capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip("not a git checkout")
    links = [line.split("\t", 1)[1] for line in out.stdout.splitlines() if line.startswith("120000 ")]
    assert links == []


@pytest.mark.parametrize(
    "how", ["editable, cwd = checkout", "editable, cwd elsewhere", "checkout on sys.path"]
)
def test_the_areas_import_from_a_checkout(how, tmp_path):
    """gpubox.bench & co. import from this checkout three ways: through the editable install's
    finder (with the checkout's ./gpubox first on sys.path, and from another folder), and with no
    install at all (the editable finder removed; the checkout on sys.path, as PYTHONPATH=$PWD does)."""
    code = "import gpubox.bench.client, gpubox.bench.report, gpubox.hwtune.numa, gpubox.provision.stage\n"
    code += "print(gpubox.bench.client.__file__)\n"
    argv, cwd = [sys.executable, "-c", code], ROOT
    if how == "editable, cwd elsewhere":
        cwd = tmp_path
    elif how == "checkout on sys.path":  # the editable finder taken out, as without any install
        drop = "sys.meta_path[:] = [f for f in sys.meta_path if '__editable__' not in getattr(f, '__module__', '')]"
        argv = [sys.executable, "-c", f"import sys; {drop}; sys.path.insert(0, {str(ROOT)!r})\n" + code]
        cwd = tmp_path
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=cwd)
    if how.startswith("editable") and r.returncode != 0 and "No module named 'gpubox'" in r.stderr:
        pytest.skip("gpubox is not installed in this interpreter (./install.sh --dev)")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == str(ROOT / "bench" / "client.py")


def test_the_license_ships_in_the_wheel_and_the_collection(wheel):
    """Apache-2.0 is declared (pyproject, galaxy.yml): its text must travel with every artefact."""
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    z = zipfile.ZipFile(wheel)
    (lic,) = [n for n in z.namelist() if n.endswith(".dist-info/licenses/LICENSE")]
    assert z.read(lic).decode() == text
    collection = ROOT / "playbooks/collections/ansible_collections/gpubox/gpubox/LICENSE"
    assert collection.read_text() == text


def test_python_dash_m_gpubox_is_the_cli():
    p = subprocess.run([sys.executable, "-m", "gpubox", "--help"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "Usage:" in p.stdout and "recover" in p.stdout
