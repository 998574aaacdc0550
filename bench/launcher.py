"""Start an inference server at TP N, wait until it serves, and tear it down with no orphans.

One module (about 580 lines): the presets and the Server lifecycle they feed are read together; each
preset is a few lines of argv.

Presets build the exact argv (never a shell string) for:

- vLLM `auto` (autoregressive), `linear` (DFlash: `--speculative-config {"method":"dflash",...}`),
  `ddtree` (method "ddtree", budget = num_speculative_tokens, attention backend TREE_ATTN);
- SGLang `linear` (`--speculative-algorithm DFLASH`) and `ddtree` (`DDTREE`,
  `--speculative-ddtree-budget`), plus `auto`;
- `custom`: an argv template with {model} {drafter} {tp} {port} {budget} {gpus} {method}
  {max_model_len} {host} {python}. Substitution happens per argv element after splitting, so a
  value can never add arguments.

The flag names were read from the vLLM and SGLang sources (recorded with file and commit in
tests/data/bench_flags.json). DDTree itself is in open PRs (docs/facts.md "Serving benchmarks"), which is
why every preset can be overridden by `gpubox_bench.command` and `extra_args`.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpubox.errors import GpuboxError

if TYPE_CHECKING:
    import httpx
    import psutil

METHODS = ("auto", "linear", "ddtree")
ENGINES = ("vllm", "sglang", "custom")
DEFAULT_BUDGET = 15


class LaunchError(GpuboxError):
    """The server did not come up (or died); carries the tail of its log."""

    def __init__(self, problem: str, fix: str | None = None, log_tail: str | None = None):
        super().__init__(problem, fix)
        self.log_tail = log_tail


def parse_method(label: str) -> tuple[str, int | None, str]:
    """'ddtree:15' -> ('ddtree', 15, 'ddtree:15'); 'auto' -> ('auto', None, 'auto')."""
    name, _, b = str(label).strip().partition(":")
    name = {"dflash": "linear"}.get(name, name)
    if name not in METHODS:
        raise GpuboxError(
            f"unknown method {label!r}", "use one of auto, linear[:B], ddtree[:B] (e.g. ddtree:15)"
        )
    if name == "auto":
        if b:
            raise GpuboxError(f"method {label!r}: auto takes no budget", "write just 'auto'")
        return name, None, "auto"
    try:
        budget = int(b) if b else DEFAULT_BUDGET
    except ValueError:
        raise GpuboxError(f"method {label!r}: budget {b!r} is not a number", "write e.g. ddtree:15") from None
    if not 1 <= budget <= 256:
        raise GpuboxError(f"method {label!r}: budget {budget} out of range", "use 1..256")
    return name, budget, f"{name}:{budget}"


def gpus_for_tp(n: int, ctx=None) -> list[int]:
    """GPU indices for TP n: hwtune.topology's choice (one NUMA node when possible: TP4 on GPUs
    0-3 of a 2-node box). The one place that asks the topology (a fact of the run, bench.gpus);
    without a context, GPUs 0..n-1."""
    if ctx is None:
        return list(range(n))
    from gpubox.hwtune import topology

    from .gpus import box_topology

    choice = topology.gpus_for_tp(box_topology(ctx), n)
    if not choice.fits:
        raise GpuboxError(f"{ctx.box.name}: {choice.reason}", "use a TP size the box can hold")
    return list(choice.gpus)


def nccl_env(ctx) -> dict[str, str]:
    """The box's NCCL profile (gpubox_nccl_profile, validated by hwtune.nccl) as environment
    variables for the server; {} when the box sets no profile."""
    if ctx is None:
        return {}
    name = ctx.box.var("gpubox_nccl_profile")
    if not name:
        return {}
    from gpubox.hwtune import nccl

    return dict(nccl.load_profile(str(name)).env)


@dataclass
class ServerSpec:
    engine: str
    method: str
    budget: int | None
    tp: int
    port: int = 8000
    model: str = ""
    drafter: str | None = None
    max_model_len: int | None = None
    host: str = "127.0.0.1"
    gpus: list[int] = field(default_factory=list)
    extra_args: list[str] = field(default_factory=list)
    template: list[str] | str | None = None
    env: dict[str, str] = field(default_factory=dict)
    attention: str = (
        "flag"  # vLLM TREE_ATTN via --attention-backend ("flag") or VLLM_ATTENTION_BACKEND ("env")
    )
    vllm_bin: str = "vllm"
    python: str = "python3"

    @property
    def label(self) -> str:
        return self.method if self.budget is None else f"{self.method}:{self.budget}"


def _need_drafter(spec: ServerSpec) -> str:
    if not spec.drafter:
        raise GpuboxError(
            f"method {spec.label} needs a drafter model path",
            "set gpubox_drafter.dest (or gpubox_bench.drafter) in the inventory",
        )
    return spec.drafter


def build_command(spec: ServerSpec) -> tuple[list[str], dict[str, str]]:
    """(argv, extra environment) for the spec. Pure: touches nothing."""
    if spec.engine not in ENGINES:
        raise GpuboxError(f"unknown engine {spec.engine!r}", "use vllm, sglang or custom")
    if spec.method not in METHODS:
        raise GpuboxError(f"unknown method {spec.method!r}", "use auto, linear or ddtree")
    gpus = spec.gpus or list(range(spec.tp))
    env = {"CUDA_VISIBLE_DEVICES": ",".join(map(str, gpus))}
    env.update(spec.env)
    budget = spec.budget or DEFAULT_BUDGET
    if spec.engine == "vllm":
        argv = [
            spec.vllm_bin,
            "serve",
            spec.model,
            "--host",
            spec.host,
            "--port",
            str(spec.port),
            "--tensor-parallel-size",
            str(spec.tp),
        ]
        if spec.max_model_len:
            argv += ["--max-model-len", str(spec.max_model_len)]
        if spec.method in ("linear", "ddtree"):
            cfg = {
                "method": "dflash" if spec.method == "linear" else "ddtree",
                "model": _need_drafter(spec),
                "num_speculative_tokens": budget,
            }
            argv += ["--speculative-config", json.dumps(cfg, separators=(",", ":"))]
        if spec.method == "ddtree":
            if spec.attention == "env":  # older vLLM: only the environment variable exists
                env["VLLM_ATTENTION_BACKEND"] = "TREE_ATTN"
            else:
                argv += ["--attention-backend", "TREE_ATTN"]
    elif spec.engine == "sglang":
        argv = [
            spec.python,
            "-m",
            "sglang.launch_server",
            "--model-path",
            spec.model,
            "--host",
            spec.host,
            "--port",
            str(spec.port),
            "--tp-size",
            str(spec.tp),
        ]
        if spec.max_model_len:
            argv += ["--context-length", str(spec.max_model_len)]
        if spec.method == "linear":
            argv += [
                "--speculative-algorithm",
                "DFLASH",
                "--speculative-draft-model-path",
                _need_drafter(spec),
                "--speculative-num-draft-tokens",
                str(budget),
            ]
        elif spec.method == "ddtree":
            argv += [
                "--speculative-algorithm",
                "DDTREE",
                "--speculative-draft-model-path",
                _need_drafter(spec),
                "--speculative-ddtree-budget",
                str(budget),
            ]
    else:
        if not spec.template:
            raise GpuboxError(
                "engine custom needs a command template",
                "set gpubox_bench.command, e.g. [my-server, --port, '{port}', --tp, '{tp}']",
            )
        parts = (
            shlex.split(spec.template) if isinstance(spec.template, str) else [str(p) for p in spec.template]
        )
        values = {
            "model": spec.model,
            "drafter": spec.drafter or "",
            "tp": spec.tp,
            "port": spec.port,
            "budget": spec.budget if spec.budget is not None else 0,
            "gpus": ",".join(map(str, gpus)),
            "method": spec.method,
            "max_model_len": spec.max_model_len or "",
            "host": spec.host,
            "python": sys.executable,
        }
        try:
            argv = [p.format(**values) for p in parts]
        except (KeyError, IndexError, ValueError) as exc:
            raise GpuboxError(
                f"command template: unknown or bad placeholder {exc}",
                f"use only {{{'}, {'.join(sorted(values))}}}",
            ) from None
    return argv + list(spec.extra_args), env


# -- process control ---------------------------------------------------------------------------------
def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        try:
            s.connect((host if host not in ("0.0.0.0", "") else "127.0.0.1", port))
            return True
        except OSError:
            pass
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # SO_REUSEADDR as the servers themselves bind (uvicorn, vLLM, llama-server): connections the
        # previous server closed leave TIME_WAIT on the port for 60 s, which refuses a plain bind
        # although the next server starts fine (seen: interop's second server on the same port)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            return False
        except OSError:
            return True


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def tail(path: Path | str, lines: int = 20) -> str:
    try:
        data = Path(path).read_bytes()[-16384:]
    except OSError:
        return ""
    return "\n".join(data.decode(errors="replace").splitlines()[-lines:])


_CAUSE = re.compile(r"\b(\w*(?:Error|Exception)|error|ERROR|FATAL|Fatal|CUDA)\b[:\s]")


def cause_line(log_tail: str) -> str | None:
    """The line of a server's log tail that names why it stopped: the first that carries an error
    or exception name (vLLM and SGLang print the root cause first and "See root cause above"
    after it), without gpubox's own header line and a leading log level; None when none does."""
    for line in log_tail.splitlines():
        text = line.strip()
        if not text or text.startswith("# gpubox:") or "see root cause above" in text.lower():
            continue
        if _CAUSE.search(text):
            return re.sub(r"^(?:ERROR|CRITICAL|FATAL)\s+", "", text)[:300]
    return None


class Server:
    """A server process in its own process group, logging to a file.

    `with Server(argv, env, port, log).started(timeout):` starts, waits for readiness and always
    tears down the whole group (SIGTERM, then SIGKILL), waiting until every process is gone.
    """

    def __init__(
        self,
        argv: list[str],
        env: dict[str, str],
        *,
        host: str = "127.0.0.1",
        port: int,
        log_path: Path | str,
        cwd: str | None = None,
        model: str | None = None,
    ):
        self.argv, self.env, self.host, self.port = list(argv), dict(env), host, port
        self.model = model  # what it serves: asked for when /v1/models lists nothing
        self.log_path = Path(log_path)
        self.cwd = cwd
        self.proc: subprocess.Popen | None = None
        self.startup_s: float | None = None
        self._seen: dict[int, psutil.Process] = {}

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}"

    def start(self) -> None:
        if port_in_use(self.host, self.port):
            raise LaunchError(
                f"port {self.port} on {self.host} is already in use",
                "stop whatever listens there (`ss -ltnp`) or set gpubox_bench.port",
            )
        from gpubox.safeio import open_append

        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open_append(self.log_path)  # never through a link planted at the log's name
        log.write(f"# gpubox: {' '.join(shlex.quote(a) for a in self.argv)}\n".encode())
        log.flush()
        try:
            self.proc = subprocess.Popen(
                self.argv,
                env={**os.environ, **self.env},
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd=self.cwd,
                preexec_fn=_die_with_parent(),
            )
        except OSError as exc:
            raise LaunchError(
                f"cannot start `{self.argv[0]}`: {exc.strerror}",
                "is the server installed in the container and on PATH?",
            ) from None
        finally:
            log.close()
        self._t0 = time.monotonic()

    def _remember_children(self) -> None:
        """Track descendants while they exist, so ones that leave the group are still reaped."""
        import psutil

        if not self.proc:
            return
        try:
            p = psutil.Process(self.proc.pid)
            for c in [p, *p.children(recursive=True)]:
                self._seen.setdefault(c.pid, c)
        except psutil.Error:
            pass

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def crashed(self, when: str) -> LaunchError:
        rc = self.proc.returncode if self.proc else None
        log = tail(self.log_path)
        cause = cause_line(log)
        return LaunchError(
            f"server exited with status {rc} {when}"
            + (f": {cause}" if cause else "")
            + f" (log {self.log_path})",
            "see the log tail; fix the server command or the box",
            log,
        )

    def wait_ready(self, timeout: float = 900.0, poll: float = 0.1) -> float:
        """Poll until the server serves; seconds it took.

        Ready = /health 200 or absent, and /v1/models lists a model. /health is not universal
        (llama-cpp-python has none): a 404/405 there means "no such endpoint", not "not ready"; a
        5xx still means loading. A server that lists no model (transformers serve 5.x lists only
        Hugging Face cache repos: `{"data": []}` for a local directory, 500 without a cache) is
        ready only once a one-token request for `model` answers 200: an answering HTTP port is
        not a loaded model. The timeout error names what each endpoint last answered."""
        import httpx

        deadline = time.monotonic() + timeout
        seen = {"/health": "no answer", "/v1/models": "no answer"}
        asked: dict[str, int | str] = {}  # a request for the named model, where none is listed
        with httpx.Client(timeout=2.0) as h:
            while True:
                self._remember_children()
                if not self.alive():
                    raise self.crashed("during start-up")
                listed = None
                for path in list(seen):
                    try:
                        r = h.get(self.url + path)
                        seen[path] = r.status_code
                        if path == "/v1/models" and r.status_code == 200:
                            listed = _listed(r)
                    except httpx.HTTPError as exc:
                        seen[path] = type(exc).__name__
                health_ok = seen["/health"] in (200, 404, 405)
                if health_ok and listed:
                    self.startup_s = time.monotonic() - self._t0
                    return self.startup_s
                if health_ok and (listed == [] or seen["/v1/models"] in (404, 500)):
                    if not self.model:
                        raise LaunchError(
                            f"the server lists no model (/v1/models {seen['/v1/models']}) and none is named",
                            "set gpubox_bench.model (the model the server loads)",
                            tail(self.log_path),
                        )
                    asked[f"a request for {self.model}"] = self._try_model(h)
                    if 200 in asked.values():
                        self.startup_s = time.monotonic() - self._t0
                        return self.startup_s
                if time.monotonic() > deadline:
                    said = ", ".join(f"{p} {v}" for p, v in {**seen, **asked}.items())
                    raise LaunchError(
                        f"server not ready after {timeout:.0f} s (last: {said})",
                        "raise gpubox_bench.ready_timeout or check the log",
                        tail(self.log_path),
                    )
                time.sleep(poll)

    def _try_model(self, h: httpx.Client) -> int | str:
        """Status of a one-token request for self.model (chat, else plain completions)."""
        import httpx

        status: int | str = "no answer"
        for path, body in (
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "ping"}]}),
            ("/v1/completions", {"prompt": "ping"}),
        ):
            try:
                r = h.post(
                    self.url + path,
                    json={"model": self.model, "max_tokens": 1, "stream": False, **body},
                    timeout=60.0,
                )
                status = r.status_code
            except httpx.HTTPError as exc:
                status = type(exc).__name__
            if status != 404:
                return status
        return status

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM the process group, wait, SIGKILL what is left; return when all are gone."""
        import psutil

        if not self.proc:
            return
        self._remember_children()
        procs = [p for p in self._seen.values() if p.pid != os.getpid()]
        pgid = self.proc.pid
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(pgid, sig)
            except (ProcessLookupError, PermissionError):
                pass
            for p in procs:  # descendants that started their own session are not in the group
                try:
                    p.send_signal(sig)
                except psutil.Error:
                    pass
            try:
                self.proc.wait(timeout=timeout if sig == signal.SIGTERM else 10)
            except subprocess.TimeoutExpired:
                pass
            _, alive = psutil.wait_procs(procs, timeout=timeout if sig == signal.SIGTERM else 10)
            if not alive and self.proc.poll() is not None:
                break
        if self.proc.poll() is None:
            self.proc.wait(timeout=5)
        wait_gpus_free([p.pid for p in procs])

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _listed(r: httpx.Response) -> list | None:
    """The model list of a /v1/models answer; None when it is not one."""
    try:
        data = r.json().get("data")
    except (ValueError, AttributeError):
        return None
    return data if isinstance(data, list) else None


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _die_with_parent():
    """preexec_fn for a launched server: SIGTERM to it when gpubox dies, even by SIGKILL.

    The server runs in its own session (so teardown can signal its whole group), which also
    takes it out of reach of a terminal's Ctrl-C and of gpubox's own death: prctl(2)
    PR_SET_PDEATHSIG asks the kernel to send it SIGTERM when the thread that started it ends
    (SIGTERM, not SIGKILL, so the server can still stop its own workers). The kernel sends it
    when that *thread* exits, so it is set only for servers started from the main thread.
    Checking the parent after prctl closes the race where gpubox died before it. None where
    prctl is not there (not Linux)."""
    import threading

    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    parent = os.getpid()

    def preexec() -> None:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return preexec


def wait_gpus_free(pids: list[int], timeout: float = 60.0) -> bool:
    """Wait until no GPU reports a compute process among `pids` (NVML); True when there is no NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return True
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            busy = False
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                if any(p.pid in pids for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)):
                    busy = True
            if not busy:
                return True
            time.sleep(0.5)
        return False
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def spec_from_box(ctx, method_label: str, tp: int, settings: dict[str, Any] | None = None) -> ServerSpec:
    """A ServerSpec from the box's inventory (gpubox_bench, gpubox_model, gpubox_drafter)."""
    b = dict(settings if settings is not None else (ctx.box.var("gpubox_bench", {}) or {}))
    method, budget, _ = parse_method(method_label)
    model = b.get("model") or (ctx.box.var("gpubox_model", {}) or {}).get("dest") or ""
    drafter = b.get("drafter") or (ctx.box.var("gpubox_drafter", {}) or {}).get("dest")
    extra = b.get("extra_args") or []
    if isinstance(extra, str):
        extra = shlex.split(extra)
    env = {str(k): str(v) for k, v in (b.get("env") or {}).items()}
    env = {**nccl_env(ctx), **env}
    return ServerSpec(
        engine=str(b.get("engine", "vllm")),
        method=method,
        budget=budget,
        tp=int(tp),
        port=int(b.get("port", 8000)),
        model=str(model),
        drafter=drafter,
        max_model_len=b.get("max_model_len"),
        host=str(b.get("host", "127.0.0.1")),
        gpus=gpus_for_tp(int(tp), ctx),
        extra_args=[str(x) for x in extra],
        template=b.get("command"),
        env=env,
        attention=str(b.get("attention", "flag")),
        vllm_bin=str(b.get("vllm_bin", "vllm")),
        python=str(b.get("python", "python3")),
    )
