"""NCCL profiles: validation against the documented table, exports read back by their consumers,
and the box step on a simulated container."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from gpubox.context import Context
from gpubox.errors import GpuboxError
from gpubox.hwtune import nccl, steps
from gpubox.hwtune.nccl import CONF_FILE, ENV_FILE
from gpubox.inventory import Inventory
from gpubox.pipeline import run_steps
from gpubox.simbox import build


def gpubox(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "gpubox.cli", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=120,
    )


def bash_env(path) -> dict[str, str]:
    """What a shell sees after `source FILE` (set -a exports plain K=V lines too)."""
    out = subprocess.run(
        ["bash", "-c", 'set -a; source "$1"; env -0', "bash", str(path)],
        capture_output=True,
        check=True,
        env={"PATH": os.environ["PATH"]},
    ).stdout.decode()
    pairs = (item.split("=", 1) for item in out.split("\0") if "=" in item)
    return {k: v for k, v in pairs if k.startswith("NCCL_")}


# A profile whose values need every kind of care in every format.
TRICKY = {
    "NCCL_PROTO": "LL,Simple",
    "NCCL_SOCKET_IFNAME": "=eth0,^docker",
    "NCCL_DEBUG_FILE": "/var/log/nccl $HOME `x` %h.%p",
    "NCCL_DEBUG_TIMESTAMP_FORMAT": "[%F %T] it's",
    "NCCL_IB_HCA": 'mlx5_0:1 "a\\b"',
}


@pytest.fixture
def tricky_profile(tmp_path):
    import yaml

    p = tmp_path / "tricky.yaml"
    p.write_text(yaml.safe_dump({"name": "tricky", "description": "quoting torture", "env": TRICKY}))
    return p


# -- validation -------------------------------------------------------------------------------
def test_typos_are_caught_with_did_you_mean():
    issues = {
        (i.name, i.level): i for i in nccl.validate({"NCCL_MIN_NCHANNEL": "8", "NCCL_PROTO": "LL,Simpel"})
    }
    name = issues[("NCCL_MIN_NCHANNEL", "error")]
    assert name.suggestion == "NCCL_MIN_NCHANNELS" and "ignores it silently" in name.message
    proto = issues[("NCCL_PROTO", "error")]
    assert proto.suggestion == "Simple" and "'Simpel'" in proto.message


@pytest.mark.parametrize(
    "name,value,fragment",
    [
        ("NCCL_ALGO", "Ring,Tre", "unknown algorithm 'Tre'"),
        ("NCCL_ALGO", "allreduc:tree", "unknown collective 'allreduc'"),
        ("NCCL_P2P_LEVEL", "NVLINK", "silently ignore"),
        ("NCCL_NTHREADS", "100", "not one of 64, 128, 256, 512"),
        ("NCCL_MIN_CTAS", "65", "outside 1..64"),
        ("NCCL_IB_DISABLE", "yes", "not 0 or 1"),
        ("NCCL_DEBUG", "VERBOSE", "not one of"),
        ("NCCL_DEBUG_SUBSYS", "INIT,GRAPHS", "unknown entry 'GRAPHS'"),
        ("NCCL_BUFFSIZE", "4M", "not an integer"),
    ],
)
def test_bad_values_are_errors(name, value, fragment):
    errs = nccl.errors(nccl.validate({name: value}))
    assert errs and any(fragment in e.message for e in errs), [str(e) for e in errs]


@pytest.mark.parametrize(
    "name,value",
    [
        ("NCCL_ALGO", "ring,collnetdirect;allreduce:tree,collnetdirect;broadcast:ring"),
        ("NCCL_ALGO", "allreduce:^tree"),
        ("NCCL_PROTO", "^LL128"),
        ("NCCL_P2P_LEVEL", "sys"),
        ("NCCL_BUFFSIZE", "0x400000"),
        ("NCCL_DEBUG", "warn"),
        ("NCCL_DEBUG_SUBSYS", "^INIT,COLL"),
        ("NCCL_CTA_POLICY", "EFFICIENCY|ZERO"),
        ("NCCL_NETDEVS_POLICY", "MAX:2"),
        ("NCCL_SOCKET_IFNAME", "=eth0"),
    ],
)
def test_documented_values_pass(name, value):
    assert nccl.errors(nccl.validate({name: value})) == []


def test_deprecated_and_debug_class_warn():
    issues = nccl.validate({"NCCL_MIN_NCHANNELS": "8", "NCCL_SOCKET_IFNAME": "eth0"})
    msgs = [str(i) for i in issues if i.level == "warning"]
    assert any("deprecated since NCCL 2.17; use NCCL_MIN_CTAS" in m for m in msgs)
    assert any("debugging knob" in m and m.startswith("NCCL_MIN_NCHANNELS") for m in msgs)
    assert not any(m.startswith("NCCL_SOCKET_IFNAME") for m in msgs)  # system-class: no warning
    assert not nccl.errors(issues)


def test_undocumented_source_names_warn_and_unknown_names_error():
    issues = nccl.validate({"NCCL_NVLS_NCHANNELS": "8", "NCCL_FOO": "1", " NCCL_DEBUG": "WARN"})
    by = {i.name: i for i in issues}
    assert (
        by["NCCL_NVLS_NCHANNELS"].level == "warning" and "not documented" in by["NCCL_NVLS_NCHANNELS"].message
    )
    assert by["NCCL_FOO"].level == "error" and by["NCCL_FOO"].suggestion is None
    assert by[" NCCL_DEBUG"].level == "error" and "spaces" in by[" NCCL_DEBUG"].message


def test_table_is_built_from_the_docs():
    t = nccl.table()
    assert "env.rst" in t["source"]
    v = t["variables"]
    assert v["NCCL_PROTO"]["class"] == "debug" and v["NCCL_SOCKET_IFNAME"]["class"] == "system"
    assert v["NCCL_MAX_NCHANNELS"]["deprecated"] == {"since": "2.17", "use": "NCCL_MAX_CTAS"}
    assert len(v) > 100


# -- exports, read back by their consumers ------------------------------------------------------
@pytest.mark.parametrize("fmt", ["shell", "envfile"])
def test_bash_source_reads_back_exactly(tmp_path, fmt):
    f = tmp_path / f"nccl.{fmt}"
    f.write_text(nccl.render(TRICKY, fmt, header="test"))
    assert bash_env(f) == TRICKY


def test_envfile_strict_parser_agrees(tmp_path):
    text = nccl.render(TRICKY, "envfile", header="x")
    assert nccl.parse_envfile(text) == TRICKY
    # systemd rules the parser follows: comments, whitespace trimming, quotes, escapes, continuation
    sample = (
        '# c\n; c2\n  NCCL_A = spaced value  \nNCCL_B=\'a $b \\n\'\nNCCL_C="q \\" \\$x \\\\"\n'
        "NCCL_D=one\\\ntwo\nnot a line\n1BAD=x\n"
    )
    assert nccl.parse_envfile(sample) == {
        "NCCL_A": "spaced value",
        "NCCL_B": "a $b \\n",
        "NCCL_C": 'q " $x \\',
        "NCCL_D": "onetwo",
    }


def test_docker_and_ncclconf_are_literal(tmp_path):
    simple = {"NCCL_PROTO": "LL", "NCCL_SOCKET_IFNAME": "=eth0,^docker", "NCCL_DEBUG_FILE": "/tmp/a b.%p"}
    for fmt, parser in (("docker", nccl.parse_docker), ("ncclconf", nccl.parse_ncclconf)):
        assert parser(nccl.render(simple, fmt, header="h")) == simple
    with pytest.raises(GpuboxError, match="whitespace"):
        nccl.render({"NCCL_DEBUG": " WARN"}, "ncclconf")
    with pytest.raises(GpuboxError, match="newline"):
        nccl.render({"NCCL_DEBUG": "WARN\nNCCL_X=1"}, "shell")


def test_json_round_trip():
    assert json.loads(nccl.render(TRICKY, "json")) == TRICKY
    assert nccl.parse(nccl.render(TRICKY, "json"), "json") == TRICKY


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="needs systemd-analyze")
def test_unit_with_environment_file_verifies(tmp_path):
    env = tmp_path / "nccl.env"
    env.write_text(nccl.render(nccl.load_profile("pcie-2numa").env, "envfile"))
    unit = tmp_path / "vllm-test.service"
    unit.write_text(f"[Service]\nEnvironmentFile={env}\nExecStart=/usr/bin/env\n")
    r = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


# -- CLI ----------------------------------------------------------------------------------------
def test_cli_profiles_show_export(tmp_path, tricky_profile):
    r = gpubox("nccl", "profiles", "--json")
    assert r.returncode == 0
    profiles = json.loads(r.stdout)
    assert profiles["pcie-2numa"]["env"]["NCCL_PROTO"] == "LL"
    assert "NCCL_MIN_NCHANNELS" not in profiles["pcie-2numa"]["env"]  # deprecated: MIN_CTAS instead
    assert gpubox("nccl", "show", "pcie-2numa").returncode == 0
    out = tmp_path / "out.env"
    r = gpubox("nccl", "export", "--nccl-profile", str(tricky_profile), "--format", "envfile", "-o", str(out))
    assert r.returncode == 0 and bash_env(out) == TRICKY and nccl.parse_envfile(out.read_text()) == TRICKY
    r = gpubox("nccl", "export", "--format", "shell")
    assert r.returncode == 0 and "export NCCL_PROTO=LL" in r.stdout and "debugging knob" in r.stderr


def test_cli_unknown_profile_is_bad_input():
    r = gpubox("nccl", "export", "--nccl-profile", "pcie-2numo")
    assert r.returncode == 2 and "did you mean pcie-2numa?" in r.stderr


def test_cli_user_profile_dir_and_invalid_profile(tmp_path):
    (tmp_path / "bad.yaml").write_text("name: bad\nenv:\n  NCCL_PROTO: LL,Simpel\n")
    r = gpubox("nccl", "export", "--nccl-profile", "bad", env={"GPUBOX_NCCL_PROFILES": str(tmp_path)})
    assert r.returncode == 2 and "Simpel" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_cli_check_file_and_env(tmp_path):
    f = tmp_path / "nccl.conf"
    f.write_text("NCCL_PROTO=LL,Simpel\nNCCL_MIN_NCHANNEL=8\nNCCL_ALGO = Ring\n")
    r = gpubox("nccl", "check", str(f), "--json")
    assert r.returncode == 1
    doc = json.loads(r.stdout)
    names = {(i["name"], i["level"]) for i in doc["issues"]}
    assert {("NCCL_PROTO", "error"), ("NCCL_MIN_NCHANNEL", "error"), ("NCCL_ALGO ", "error")} <= names
    r = gpubox("nccl", "check", "--env", env={"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"})
    assert r.returncode == 0
    r = gpubox("nccl", "check", "--env", "--json", env={"NCCL_MIN_NCHANNEL": "8"})
    assert r.returncode == 1 and "NCCL_MIN_NCHANNELS" in r.stdout
    assert gpubox("nccl", "check").returncode == 2


# -- the box step -------------------------------------------------------------------------------
def make(tmp_path, faults=()):
    sim = build(tmp_path / "box", faults, gpus=1)
    inv = Inventory(sim.inventory_path)
    return sim, Context(box=inv.box("ct200"), inventory=inv, options={})


def nstep(ctx, mode):
    return run_steps(ctx, steps(ctx, ("nccl-env",)), mode)


def test_healthy_container_has_the_profile(tmp_path):
    sim, ctx = make(tmp_path)
    assert nstep(ctx, "check").steps[0].status == "ok"
    assert bash_env(sim.cpath(ENV_FILE)) == nccl.load_profile("pcie-2numa").env


def test_missing_env_is_written_and_second_run_changes_nothing(tmp_path):
    sim, ctx = make(tmp_path, ["nccl_missing"])
    chk = nstep(ctx, "check").steps[0]
    assert chk.status == "drift" and f"{ENV_FILE} missing" in chk.detail
    rep = nstep(ctx, "apply").steps[0]
    assert rep.status == "fixed" and f"+++ b{CONF_FILE}" in rep.diff
    want = nccl.load_profile("pcie-2numa").env
    assert nccl.parse_envfile(sim.cpath(ENV_FILE).read_text()) == want
    assert nccl.parse_ncclconf(sim.cpath(CONF_FILE).read_text()) == want
    assert bash_env(sim.cpath(ENV_FILE)) == want
    again = nstep(ctx, "apply")
    assert again.steps[0].status == "ok" and not again.changed


def test_misspelled_env_is_drift_with_did_you_mean(tmp_path):
    sim, ctx = make(tmp_path, ["nccl_misspelled"])
    chk = nstep(ctx, "check").steps[0]
    assert chk.status == "drift"
    assert "did you mean NCCL_MIN_NCHANNELS?" in chk.detail and "did you mean Simple?" in chk.detail
    rep = nstep(ctx, "apply").steps[0]
    assert rep.status == "fixed" and "-NCCL_MIN_NCHANNEL=8" in rep.diff
    assert "Simpel" not in sim.cpath(ENV_FILE).read_text()


def test_tune_nccl_dry_run_writes_nothing(tmp_path):
    sim, _ = make(tmp_path, ["nccl_missing"])
    r = gpubox("-i", str(sim.inventory_path), "tune", "nccl", "ct200", "--dry-run", "--json")
    assert r.returncode == 1 and "+NCCL_PROTO=LL" in json.loads(r.stdout)["steps"][0]["diff"]
    assert not sim.cpath(ENV_FILE).exists()


@pytest.mark.parametrize("profile", ["auto", None])
def test_a_fatal_value_fails_also_without_a_profile(profile):
    """`tune nccl --nccl-profile auto` on a box with no profile for its topology (or no profile set)
    must not say ok over a value NCCL refuses at start-up: failed (exit 1), the file left as it is."""
    from gpubox.hwtune.nccl_env_step import NcclEnvStep, NcclFacts, NcclOptions

    bad = "NCCL_PROTO=LL,Simpel\n"
    opts = NcclOptions(auto=profile == "auto", profiles=[], box="ct200")
    facts = NcclFacts(topology="nvlink", files={"/etc/gpubox/nccl.env": bad, "/etc/nccl.conf": None})
    f = NcclEnvStep().decide(facts, opts)
    assert f.status == "failed", f
    assert "/etc/gpubox/nccl.env" in f.detail and "Simpel" in f.detail
    assert f.plan is None or not f.plan.actions
    good = NcclFacts(topology="nvlink", files={"/etc/gpubox/nccl.env": "NCCL_PROTO=LL,Simple\n"})
    assert NcclEnvStep().decide(good, opts).status == "ok"


@pytest.mark.parametrize("fmt", ["shell", "envfile"])
def test_a_value_starting_with_equals_is_quoted(fmt):
    """NCCL's exact-match prefix (`=eth0`): bash reads `K==eth0` right, shellcheck flags it (SC1097)."""
    text = nccl.render({"NCCL_SOCKET_IFNAME": "=eth0"}, fmt)
    assert "NCCL_SOCKET_IFNAME='=eth0'" in text and "==" not in text
    assert nccl.parse(text, fmt) == {"NCCL_SOCKET_IFNAME": "=eth0"}


@pytest.mark.parametrize(
    "rows,fits,want",
    [
        ([], None, "nothing was measured"),
        ([{"verdict": "unmeasured"}], None, "nothing was measured"),
        ([{"verdict": "slower"}, {"verdict": "unmeasured"}], None, "slower"),
        ([{"verdict": "same"}], False, "another topology"),
        ([{"verdict": "same"}, {"verdict": "unmeasured"}], None, "gains nothing"),
    ],
)
def test_a_refusal_names_what_the_gate_saw(rows, fits, want):
    """`tune nccl --measure` said "slower" when nothing was measured: the cause follows the rows."""
    from gpubox.hwtune.nccl_env_step import gate_cause

    cause, repair = gate_cause({"rows": rows, "fits_topology": fits}, "p")
    assert want in cause and "gpubox_nccl_profile" in repair
    assert ("slower" in cause) == (want == "slower")
