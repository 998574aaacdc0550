"""The gpubox.gpubox Ansible collection, built, installed and checked the way a publisher would:
`ansible-galaxy collection build` + `install --offline` from its folder in this checkout, `ansible-doc` on every
module, `ansible-test sanity` (local, this interpreter, no containers) on the installed copy."""

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COLLECTION = ROOT / "playbooks/collections/ansible_collections/gpubox/gpubox"  # where the playbooks find it
MODULES = sorted(p.stem for p in (COLLECTION / "plugins" / "modules").glob("*.py") if p.stem != "__init__")
pytestmark = pytest.mark.skipif(shutil.which("ansible-galaxy") is None, reason="ansible-core not installed")


def _run(argv, **kw):
    p = subprocess.run(argv, capture_output=True, text=True, timeout=600, **kw)
    assert p.returncode == 0, f"{argv[:3]} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The collection built from the checkout and installed offline into a fresh collections path."""
    tmp = tmp_path_factory.mktemp("collection")
    _run(["ansible-galaxy", "collection", "build", "--output-path", str(tmp / "dist"), str(COLLECTION)])
    (tarball,) = (tmp / "dist").glob("gpubox-gpubox-*.tar.gz")
    _run(["ansible-galaxy", "collection", "install", "--offline", "-p", str(tmp / "cols"), str(tarball)])
    return tarball, tmp / "cols"


def test_build_holds_the_modules_and_nothing_of_the_library(installed):
    tarball, _ = installed
    with tarfile.open(tarball) as t:
        names = t.getnames()
    assert {f"plugins/modules/{m}.py" for m in MODULES} <= set(names)
    assert "meta/runtime.yml" in names and "MANIFEST.json" in names
    leaked = [
        n
        for n in names
        if n.split("/")[0]
        in {"gpubox", "bench", "provision", "hwtune", "tests", "playbooks", "benchmarks", ".git", "inventory"}
        and not (n == "tests" or n.startswith("tests/sanity"))
    ]
    assert leaked == []
    # The sanity ignore files travel with the collection (ansible-test reads them from there).
    assert "tests/sanity/ignore-2.19.txt" in names
    assert "README.md" in names and "galaxy.yml" not in names  # galaxy.yml becomes MANIFEST.json
    assert "LICENSE" in names  # Apache-2.0, declared in galaxy.yml, travels with the collection


def test_every_module_renders_with_ansible_doc(installed):
    _, cols = installed
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(cols))
    assert MODULES == ["box", "fleet", "preflight", "wheel"]
    for m in MODULES:
        p = _run(["ansible-doc", f"gpubox.gpubox.{m}"], env=env)
        assert "EXAMPLES" in p.stdout and "OPTIONS" in p.stdout, p.stdout[:500]
        assert "could not parse" not in p.stderr
        # The playbooks find the same modules through playbooks/collections (playbook-adjacent).
        _run(
            ["ansible-doc", "--playbook-dir", str(ROOT / "playbooks"), f"gpubox.gpubox.{m}"],
            env={k: v for k, v in os.environ.items() if k != "ANSIBLE_COLLECTIONS_PATH"},
        )


def test_playbooks_call_modules_by_fqcn():
    bare = []
    for y in (ROOT / "playbooks").rglob("*.yml"):
        for line in y.read_text().splitlines():
            if line.strip().rstrip(":") in {f"gpubox_{m}" for m in MODULES}:
                bare.append(f"{y}: {line.strip()}")
    assert bare == []


def test_ansible_test_sanity_passes(installed, tmp_path):
    """Every default sanity test (pylint and validate-modules included), with this interpreter, no
    containers, and the ignore file the collection ships for this ansible-core. ansible-test needs the
    collection under ansible_collections/NS/NAME: the installed copy is. It makes a venv per sanity
    test and bootstraps pip there with a get-pip.py it downloads from ci-files.testing.ansible.com;
    tests/data/get_pip_offline.py stands in (ensurepip + PyPI)."""
    _, cols = installed
    coll = cols / "ansible_collections" / "gpubox" / "gpubox"
    import ansible

    series = ".".join(ansible.__version__.split(".")[:2])
    ignore = coll / "tests" / "sanity" / f"ignore-{series}.txt"
    assert ignore.is_file(), f"the collection ships no {ignore.name}: add one for ansible-core {series}"
    home = tmp_path / "home"
    cache = home / ".ansible/test/cache"
    cache.mkdir(parents=True)
    env = dict(os.environ, HOME=str(home))
    import re

    import ansible_test

    reqs = Path(ansible_test.__file__).parent / "_internal" / "python_requirements.py"
    found = re.search(r"pip='([0-9.]+)'", reqs.read_text())  # get_venv_packages' default pip
    pip_version = found.group(1) if found else ""
    assert pip_version, "could not read ansible-test's pip version"
    shutil.copy(ROOT / "tests/data/get_pip_offline.py", cache / f"get_pip_{pip_version.replace('.', '_')}.py")
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    argv = ["ansible-test", "sanity", "--python", py, "--color", "no"]
    p = subprocess.run(argv, cwd=coll, env=env, capture_output=True, text=True, timeout=900)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-4000:]
    assert 'Running sanity test "pylint"' in out and 'Running sanity test "validate-modules"' in out, out[
        -4000:
    ]
    assert "ERROR" not in out, out[-4000:]
