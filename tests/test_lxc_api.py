"""The Proxmox API path: real proxmoxer (https backend, API token) against a local HTTPS fake of
the few PVE endpoints gpubox uses: lxc status/current, config (with digest), status/start|stop|
reboot returning a UPID, and tasks/{upid}/status."""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import json
import re
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from gpubox.errors import GpuboxError, TransportError
from gpubox.provision.pve import ApiControl
from gpubox.simbox import SimBox, build
from gpubox.simbox.cmds import pct
from gpubox.simbox.core import StandinError
from tests.clirun import gpubox

TOKEN_USER, TOKEN_NAME, SECRET = "root@pam", "gpubox", "0f1e2d3c-aaaa-bbbb-cccc-0123456789ab"


def _cert(dirpath):
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "pve1.test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    crt, pem = dirpath / "pve.crt", dirpath / "pve.key"
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pem.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return crt, pem


class FakePVE:
    """PVE API fake. Alone it keeps its own container state; given a SimBox it drives that box
    (status from sim.json, lock and config from the simulated 200.conf, actions like `pct`)."""

    def __init__(self, tmp_path, sim: SimBox | None = None, node="pve1", vmid=200, polls=2):
        self.sim, self.node, self.vmid, self.polls = sim, node, vmid, polls
        self.state = {"status": "stopped", "lock": None}
        self.tasks: dict[str, dict] = {}
        self.log: list[tuple[str, str]] = []
        self.finish_tasks = True
        self.fail_with: str | None = None
        self.exit_ok = "OK"  # or "WARNINGS: <n>" (a task that logged warnings still succeeded)
        self.cert, key = _cert(tmp_path)
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, code, data=None, msg=None):
                body = json.dumps({"data": data} if code == 200 else {"data": None, "message": msg}).encode()
                self.send_response(code, msg)
                self.send_header("Content-Type", "application/json;charset=UTF-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _route(self, method):
                fake.log.append((method, self.path))
                path, _, query = self.path.partition("?")
                if self.headers.get("Authorization") != f"PVEAPIToken={TOKEN_USER}!{TOKEN_NAME}={SECRET}":
                    return self._send(401, msg="authentication failure")
                m = re.match(r"^/api2/json/nodes/([^/]+)/(.*)$", path)
                if not m or m.group(1) != fake.node:
                    return self._send(404, msg="no such node")
                rest = m.group(2)
                t = re.match(r"^tasks/([^/]+)/status$", rest)
                if t and method == "GET":
                    return self._send(200, fake.task_status(t.group(1)))
                c = re.match(rf"^lxc/{fake.vmid}/(status/current|config|status/(start|stop|reboot))$", rest)
                if not c:
                    return self._send(501, msg=f"Method '{method} /nodes/{{node}}/{rest}' not implemented")
                if c.group(1) == "status/current" and method == "GET":
                    return self._send(200, fake.current())
                if c.group(1) == "config" and method == "GET":
                    return self._send(200, fake.config(current="current=1" in (query or "")))
                if c.group(2) and method == "POST":
                    upid, err = fake.start_task(c.group(2))
                    return self._send(200, upid) if upid else self._send(500, msg=err)
                return self._send(501, msg="not implemented")

            def do_GET(self):
                self._route("GET")

            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(n)
                self._route("POST")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.cert, key)
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    # -- the PVE side ---------------------------------------------------------------------------
    def _conf_path(self):
        return self.sim.hpath(f"/etc/pve/lxc/{self.vmid}.conf")

    def current(self):
        """status/current: LXC.pm vmstatus + `ha` (pve-container Status.pm vm_status)."""
        if self.sim:
            d = pct.status_current(self.sim, self.vmid)
        else:
            d = {
                "vmid": self.vmid,
                "type": "lxc",
                "status": self.state["status"],
                "name": "ct200",
                "cpus": 96,
                "maxmem": 393216 * 1024 * 1024,
                "maxswap": 0,
                "uptime": 0,
                "mem": 0,
                "swap": 0,
                "disk": 0,
                "maxdisk": 300 * 1024**3,
                "cpu": 0,
                "netin": 0,
                "netout": 0,
                "diskread": 0,
                "diskwrite": 0,
            }
            if self.state["lock"]:
                d["lock"] = self.state["lock"]
        d["ha"] = {"managed": 0}
        return d

    def config(self, current=False):
        """GET config: load_current_config (pending taken in unless current=1), `lxc` pairs, `digest`
        = SHA-1 of the whole file (pve-container API2/LXC/Config.pm vm_config, Config.pm parse_pct_config)."""
        conf = pct.parse_config(self._conf_path().read_text(), self.vmid)
        if current:
            return {k: v for k, v in conf.items() if k not in ("pending", "snapshots")}
        return pct.current_config(conf)

    def start_task(self, action):
        """Checks before fork_worker fail the POST itself (HTTP 500); the rest fail the task."""
        if self.sim:
            running = pct.is_running(self.sim, self.vmid)
            if action == "start" and running:
                return None, f"CT {self.vmid} already running"
            if action == "stop" and not running:
                return None, f"CT {self.vmid} not running"
            if action == "reboot" and not running:
                return None, f"VM {self.vmid} not running"
        n = len(self.tasks)
        pid, pstart, starttime = 0x10000 + n, 0xA1B2C3, 0x6745F000 + n
        # PVE::UPID encode: UPID:node:%08X pid:%08X pstart:%08X starttime:type:id:user:
        upid = f"UPID:{self.node}:{pid:08X}:{pstart:08X}:{starttime:08X}:vz{action}:{self.vmid}:{TOKEN_USER}!{TOKEN_NAME}:"
        self.tasks[upid] = {
            "action": action,
            "polls": 0,
            "pid": pid,
            "pstart": pstart,
            "starttime": starttime,
        }
        return upid, None

    def task_status(self, upid):
        """pve-manager API2/Tasks.pm read_task_status: the decoded UPID (token split off the user),
        status running|stopped, and once stopped `exitstatus` (UPID.pm read_status)."""
        t = self.tasks[upid]
        t["polls"] += 1
        d = {
            "upid": upid,
            "node": self.node,
            "pid": t["pid"],
            "pstart": t["pstart"],
            "starttime": t["starttime"],
            "type": f"vz{t['action']}",
            "id": str(self.vmid),
            "user": TOKEN_USER,
            "tokenid": TOKEN_NAME,
            "status": "running",
        }
        if not self.finish_tasks or t["polls"] < self.polls:
            return d
        if "exitstatus" not in t:
            t["exitstatus"] = self._run(t["action"])
        return {**d, "status": "stopped", "exitstatus": t["exitstatus"]}

    def _run(self, action):
        if self.fail_with:
            return self.fail_with
        if not self.sim:
            self.state["status"] = "stopped" if action == "stop" else "running"
            return self.exit_ok
        fn = {"start": pct.start, "stop": pct.stop, "reboot": pct.reboot}[action]
        try:
            fn(self.sim, self.vmid)
        except StandinError as exc:  # fork_worker: "TASK ERROR: <msg, newlines made spaces>"
            return " ".join(str(exc).split("\n"))
        return self.exit_ok

    def posts(self):
        return [p for m, p in self.log if m == "POST"]

    def api(self, **kw):
        return {
            "host": "127.0.0.1",
            "port": self.port,
            "user": TOKEN_USER,
            "token_name": TOKEN_NAME,
            "verify_ssl": str(self.cert),
            "poll": 0.05,
            **kw,
        }

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def pve(tmp_path):
    f = FakePVE(tmp_path)
    yield f
    f.close()


def _ctl(pve, secret=SECRET, timeout=10, **api):
    return ApiControl(pve.api(**api), secret, "pve1", 200, timeout=timeout, poll=0.05)


def test_start_posts_and_waits_for_the_task(pve):
    ctl = _ctl(pve)
    assert ctl.status() == {"status": "stopped", "lock": None}
    ctl.act("start")
    assert ctl.status()["status"] == "running"
    assert pve.posts() == ["/api2/json/nodes/pve1/lxc/200/status/start"]
    (task,) = pve.tasks.values()
    assert task["polls"] >= 2  # it waited on the UPID until the task stopped
    ctl.act("reboot")
    assert pve.posts()[-1].endswith("/status/reboot")


def test_locked_container_is_refused_before_any_post(pve):
    # A real reboot does not check the lock (pve-container LXC.pm vm_reboot): it would stop the CT
    # and then the prestart hook would refuse to start it. So gpubox must refuse first.
    pve.state.update(status="running", lock="backup")
    assert _ctl(pve).status() == {"status": "running", "lock": "backup"}
    for action in ("reboot", "stop"):
        with pytest.raises(GpuboxError, match=r"locked \(backup\)"):
            _ctl(pve).act(action)
    assert pve.posts() == []


def test_task_with_warnings_is_a_success(pve):
    pve.exit_ok = "WARNINGS: 1"  # UPID.pm status_is_error: OK and WARNINGS: n are not errors
    _ctl(pve).act("start")
    assert pve.state["status"] == "running"


def test_stop_of_a_stopped_ct_and_reboot_of_a_stopped_ct(tmp_path):
    sim = build(tmp_path / "box", ["container_stopped"], gpus=2)
    fake = FakePVE(tmp_path, sim)
    try:
        ctl = _ctl(fake)
        ctl.act("stop")  # nothing to do: the API would answer 500 "CT 200 not running"
        assert fake.posts() == []
        ctl.act("reboot")  # a stopped CT is started: reboot would answer 500 "VM 200 not running"
        assert fake.posts() == ["/api2/json/nodes/pve1/lxc/200/status/start"]
        with pytest.raises(GpuboxError, match="CT 200 already running"):
            ctl._do("start")  # the check before the worker fails the POST itself
    finally:
        fake.close()


def test_devn_start_failure_is_the_task_exitstatus(tmp_path):
    sim = build(tmp_path / "box", ["container_stopped"], gpus=2)
    sim.hpath("/etc/pve/lxc/200.conf").write_text(
        "arch: amd64\ndev0: /dev/nvidia-uvm,mode=0666\nhostname: ct200\n"
    )
    sim.hpath("/dev/nvidia-uvm").unlink()
    fake = FakePVE(tmp_path, sim)
    try:
        with pytest.raises(
            GpuboxError, match=r"start CT 200 failed: Device /dev/nvidia-uvm does not exist \(look"
        ):
            _ctl(fake).act("start")
    finally:
        fake.close()


def test_failed_task_is_reported_with_its_exit_status(pve):
    pve.fail_with = "startup for container '200' failed"
    with pytest.raises(GpuboxError, match="startup for container '200' failed"):
        _ctl(pve).act("start")


def test_task_that_never_ends_times_out(pve):
    pve.finish_tasks = False
    with pytest.raises(GpuboxError, match="did not finish in 0.5 s"):
        _ctl(pve, timeout=0.5).act("start")


def test_wrong_token_is_a_clear_error(pve):
    with pytest.raises(GpuboxError, match="401"):
        _ctl(pve, secret="wrong").status()


def test_untrusted_certificate_is_refused(pve):
    with pytest.raises(TransportError, match="certificate not trusted"):
        _ctl(pve, verify_ssl=True).status()


def test_config_digest_is_the_files_sha1(tmp_path):
    sim = build(tmp_path / "box", ["uvm_stale_major"], gpus=2)
    fake = FakePVE(tmp_path, sim)
    try:
        cfg = _ctl(fake).config()
    finally:
        fake.close()
    assert cfg["digest"] == hashlib.sha1(sim.hpath("/etc/pve/lxc/200.conf").read_bytes()).hexdigest()
    assert ["lxc.cgroup2.devices.allow", "c 508:* rwm"] in cfg["lxc"]
    assert "snaptime" not in cfg  # snapshot keys are not the current config
    assert cfg["memory"] == 393216 and cfg["onboot"] == 1  # check_type: integers/booleans are numbers
    assert cfg["description"].startswith("Qwen3.6-27B inference") and "passthrough: see" in cfg["description"]


def test_config_takes_pending_values_unless_current(tmp_path):
    sim = build(tmp_path / "box", ["conf_pending"], gpus=2)
    fake = FakePVE(tmp_path, sim)
    try:
        cfg = _ctl(fake).config()
        cur = fake.config(current=True)
    finally:
        fake.close()
    assert cfg["memory"] == 524288 and "swap" not in cfg  # load_current_config(current=0)
    assert cur["memory"] == 393216 and cur["swap"] == 0


def _api_box(tmp_path, fake_factory, faults):
    sim = build(tmp_path / "box", faults, gpus=2)
    fake = fake_factory(sim)
    inv = yaml.safe_load(sim.inventory_path.read_text())
    inv["all"]["children"]["proxmox_hosts"]["hosts"]["pve1"].update(
        gpubox_api=fake.api(), gpubox_api_token_env="PVE_TOKEN_SECRET_TEST"
    )
    sim.inventory_path.write_text(yaml.safe_dump(inv))
    return sim, fake


def test_fix_through_the_api_end_to_end(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PVE_TOKEN_SECRET_TEST", SECRET)
    sim, fake = _api_box(tmp_path, lambda s: FakePVE(tmp_path, s), ["uvm_missing", "uvm_stale_major"])
    try:
        rc, out, err = gpubox(capsys, "-i", sim.inventory_path, "lxc", "fix", "ct200", "--yes", "--json")
        doc = json.loads(out)
        assert rc == 0, doc
        ct = next(s for s in doc["steps"] if s["name"] == "container")
        assert ct["commands"] == [["POST", "/api2/json/nodes/pve1/lxc/200/status/reboot"]]
        assert ct["evidence"]["control"] == "api"
        assert fake.posts() == ["/api2/json/nodes/pve1/lxc/200/status/reboot"]
        assert not [c for c in sim.calls("pct") if c["argv"][:1] != ["status"]]  # no pct start/reboot
        assert sim.read_state()["containers"]["200"]["boots"] == 1
    finally:
        fake.close()


def test_api_without_the_token_in_the_environment_is_bad_input(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("PVE_TOKEN_SECRET_TEST", raising=False)
    sim, fake = _api_box(tmp_path, lambda s: FakePVE(tmp_path, s), ["container_stopped"])
    try:
        rc, out, err = gpubox(capsys, "-i", sim.inventory_path, "lxc", "fix", "ct200", "--json")
    finally:
        fake.close()
    # with --json the one error line is also a JSON object on stdout (gpubox.cli.fail)
    assert rc == 2 and json.loads(out) == {"error": err.strip(), "exit_code": 2}
    assert "PVE_TOKEN_SECRET_TEST" in err and "export" in err and len(err.strip().splitlines()) == 1
    assert fake.log == []
