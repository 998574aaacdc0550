"""Steps "model-stage" and "drafter-stage": the model in /dev/shm is a complete, verified copy.

check  = facts (the source's place, the copier's check of what is staged and its manifest) and a
         pure decide: the manifest is there, matches the source's identity, files match it,
         headers are intact (with --verify: every file re-hashed);
plan   = a `StageCopy` action: which files would be copied and how many bytes (the copier's dry
         run, read when a plan is asked for);
apply  = the action runs the copier (provision.stage); verify = check again, plus the copy's summary.

Inventory (`gpubox_model` / `gpubox_drafter` on the container):
    source: /mnt/models/Qwen3.6-27B      # persistent directory, or a Hugging Face repo id
    dest: /dev/shm/Qwen3.6-27B           # default /dev/shm/<basename of source>
    revision: main                       # repo ids only
    cache_dir: /mnt/models/hf            # repo ids only: persistent HF cache (default: HF's own)
    offline: false                       # repo ids only: never download (also $HF_HUB_OFFLINE)

Chunk hash (box-level, both models): `gpubox_stage_hash: xxh3` (default; crc32 where the copier
runs without the xxhash package), `crc32` or `sha256`; the CLI's `--hash` wins. It applies to the
files a run copies; a staged directory keeps the algorithm its manifest records, and checks/--verify
use that one (see provision.stage for why a non-cryptographic checksum).

The copier runs where the container's files are: in-process for a local transport (paths under
the container's root prefix), else as a payload (gpubox.transport.payload: the stdlib-only copier
zipped, run with the container's python3 and `--request JSON`), so the container needs python3
but no gpubox.
"""

from __future__ import annotations

import json
import os
import posixpath
from dataclasses import dataclass, field
from typing import Any

from gpubox.errors import GpuboxError, TransportError
from gpubox.facts import Fact
from gpubox.steps import OMIT, Action, Execution, Finding, Omit, Plan, Step

from . import stage as engine

REMOTE_TIMEOUT = 6 * 3600  # a 52 GB copy from slow NFS can take a while
# ...but the copier says something at least every second while it copies (stage.progress.
# LineProgress), so ten minutes of silence is a hung python or mount, not a slow copy.
REMOTE_IDLE = 600
_PYTHON_CHECKED: set[int] = set()  # hosts whose python answered payload.check_python


def _gb(n: int) -> str:
    return engine.size_text(n)


def model_spec(ctx, var: str) -> dict | None:
    """The normalised `gpubox_model`/`gpubox_drafter` setting, or None when it is not set."""
    v = ctx.box.var(var)
    if not v:
        return None
    if isinstance(v, str):
        v = {"source": v}
    if not isinstance(v, dict) or not v.get("source"):
        raise GpuboxError(
            f"{var} has no source", f"set {var}: {{source: /mnt/models/NAME, dest: /dev/shm/NAME}}"
        )
    source = str(v["source"]).rstrip("/") or "/"
    repo = not source.startswith("/")
    if repo and (source.count("/") != 1 or " " in source):
        raise GpuboxError(
            f"{var}.source {source!r} is neither an absolute path nor a repo id (org/name)",
            "give the persistent model directory or a Hugging Face repo id",
        )
    dest = str(v.get("dest") or f"/dev/shm/{posixpath.basename(source)}")
    from gpubox.safepath import canonical

    if not dest.startswith("/") or canonical(dest) in ("/", "/dev", "/dev/shm"):
        raise GpuboxError(
            f"{var}.dest {dest!r} must be an absolute directory of its own", "e.g. dest: /dev/shm/Qwen3.6-27B"
        )
    offline = bool(v.get("offline")) or os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0")
    return {
        "var": var,
        "source": source,
        "dest": dest,
        "repo": source if repo else None,
        "revision": v.get("revision"),
        "cache_dir": v.get("cache_dir"),
        "offline": offline,
        "hash": stage_hash(ctx),
    }


def stage_hash(ctx) -> str | None:
    """The requested chunk hash: --hash, else the box's gpubox_stage_hash, else None (the copier's
    default: xxh3, or crc32 where it runs without xxhash). Checked here so a typo is exit 2 before
    anything runs."""
    name = ctx.opt("hash") or ctx.box.var("gpubox_stage_hash")
    if name is None:
        return None
    if str(name) not in engine.HASHES:
        raise GpuboxError(
            f"gpubox_stage_hash {name!r} is not a hash the stager knows",
            f"use one of: {', '.join(engine.HASHES)} (default {engine.DEFAULT_HASH})",
        )
    return str(name)


def copier(host, req: dict, progress=None) -> dict:
    """Run one copier request where the container's files are: in-process for a local transport,
    else the copier's payload with the container's python3."""
    if host.transport.is_local:
        try:
            return engine.run_request(req, progress)
        except engine.StageError as exc:
            return {"error": exc.problem, "fix": exc.fix}
        except OSError as exc:
            return {
                "error": f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": "),
                "fix": "check the paths and permissions in the container",
            }
    # The copier's progress lines come back live through the transport (gpubox.progress).
    from gpubox.progress import Relay, without_progress
    from gpubox.transport import payload

    # One short call first: a copy may be given hours, a python that is too old or silent must
    # not be (payload.check_python, once per host and run).
    if id(host) not in _PYTHON_CHECKED:
        payload.check_python(host)
        _PYTHON_CHECKED.add(id(host))
    relay = Relay(progress=progress)
    try:
        r = payload.run(
            host,
            "gpubox.provision.stage.__main__",
            ["--request", json.dumps({**req, "progress": "lines"})],
            timeout=REMOTE_TIMEOUT,
            on_stderr=relay,
            idle=REMOTE_IDLE,
        )
    finally:
        relay.close()
    r.stderr = without_progress(r.stderr)
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        raise TransportError(
            f"{host.name}: the copier did not answer (rc {r.rc}): "
            f"{(r.stderr.strip().splitlines() or [''])[-1]}",
            "the container needs python3 >= 3.9 on PATH",
        ) from None


def resolve_source(host, spec: dict, download: bool) -> str | None:
    """Logical path of the source directory; for a repo id its HF cache snapshot (None: not
    cached and `download` is false)."""
    if not spec["repo"]:
        return spec["source"]
    args = {
        "repo": spec["repo"],
        "revision": spec["revision"],
        "cache_dir": host.path(spec["cache_dir"]) if spec["cache_dir"] else None,
        "local_only": spec["offline"] or not download,
    }
    if host.transport.is_local:
        try:
            from huggingface_hub import snapshot_download

            real = snapshot_download(
                args["repo"],
                revision=args["revision"],
                cache_dir=args["cache_dir"],
                local_files_only=args["local_only"],
            )
        except Exception as exc:  # huggingface_hub raises many kinds (offline, not cached, 404)
            if not download:
                return None
            raise GpuboxError(
                f"{spec['repo']}: cannot get it from the hub or the cache: {type(exc).__name__}",
                "check the repo id/revision and network, or fill the cache and set offline",
            ) from None
    else:
        from gpubox.transport import payload

        r = payload.run(host, "gpubox.provision.hf_snapshot", [json.dumps(args)], timeout=REMOTE_TIMEOUT)
        if r.rc != 0:
            if not download:
                return None
            raise GpuboxError(
                f"{spec['repo']}: cannot get it in {host.name}: {r.stdout.strip() or r.stderr.strip()}",
                "install huggingface_hub in the container, or stage from a directory",
            )
        real = r.stdout.strip().splitlines()[-1]
    root = host.root.rstrip("/")
    return real[len(root) :] if root and real.startswith(root + "/") else real


# --- facts ------------------------------------------------------------------------------------


class StageSource(Fact):
    """Where the source is in the container: the directory, or a repo id's HF cache snapshot
    (None: not cached yet). Never downloads."""

    where = "container"

    @staticmethod
    def read(host, spec_json: str) -> str | None:
        return resolve_source(host, json.loads(spec_json), download=False)


class StagedCopy(Fact):
    """The copier's `check` of a staged directory against its source: the manifest is there and
    matches the source's identity, the files match it (with verify: re-hashed)."""

    where = "container"

    @staticmethod
    def read(host, req_json: str) -> dict:
        return copier(host, json.loads(req_json))


# --- the step ---------------------------------------------------------------------------------


@dataclass
class StageFacts:
    source: str | None  # logical source directory; None: repo not cached
    check: dict[str, Any] | None = None  # the copier's check output (what is staged)


@dataclass
class StageOptions:
    source: str  # as the inventory gives it (path or repo id)
    dest: str
    repo: str | None = None
    verify: bool = False
    box: str = "BOX"


@dataclass
class StageEvidence:
    source: str
    dest: str
    files: int | Omit = OMIT
    bytes: int | Omit = OMIT
    verified: int | Omit = OMIT
    problems: list[str] | Omit = OMIT
    hashes: list[str] | Omit = OMIT
    staged: dict[str, Any] | Omit = (
        OMIT  # after apply: the copier's summary of the copy (`gpubox stage` shows it)
    )


class StageStep(Step):
    """A model staged in tmpfs. The finding is a pure decision over facts (the copier's check of
    what is staged and its manifest); its repair is one `StageCopy` action, because staging is
    the copier itself (parallel, hashed, resumable, manifest last), not a list of file writes."""

    where = "container"
    requires = ("container",)

    def __init__(self, name: str, var: str, require_tokenizer: bool):
        self.name, self.var, self.require_tokenizer = name, var, require_tokenizer
        self.title = f"{'model' if require_tokenizer else 'drafter'} staged in tmpfs"

    # -- where the copier runs -------------------------------------------------------------
    def _call(self, ctx, req: dict, progress=None) -> dict:
        return copier(ctx.container, self._full(ctx, req), progress)

    def _full(self, ctx, req: dict) -> dict:
        return {
            **req,
            "require_tokenizer": self.require_tokenizer,
            "workers": ctx.opt("workers"),
            "cgroup_dir": ctx.container.path("/sys/fs/cgroup"),
        }

    def _source(self, ctx, spec: dict, download: bool) -> str | None:
        if not download:
            return ctx.fact(StageSource, json.dumps(spec, sort_keys=True))
        return resolve_source(ctx.container, spec, download)

    def _request(self, ctx, spec: dict, src: str, op: str) -> dict:
        host = ctx.container
        return {
            "op": op,
            "src": host.path(src),
            "dest": host.path(spec["dest"]),
            "verify": bool(ctx.opt("verify")),
            "hash": spec["hash"],
            "follow_links": bool(ctx.opt("follow_links")),
            "tmpfs": True if spec["dest"].startswith("/dev/shm/") else None,
            "source_info": {
                k: v for k, v in (("path", src), ("repo", spec["repo"]), ("revision", spec["revision"])) if v
            },
        }

    # -- facts, options, decision ----------------------------------------------------------
    def options(self, ctx) -> StageOptions:
        spec = model_spec(ctx, self.var)
        return StageOptions(spec["source"], spec["dest"], spec["repo"], bool(ctx.opt("verify")), ctx.box.name)

    def gather(self, ctx) -> StageFacts:
        spec = model_spec(ctx, self.var)
        src = self._source(ctx, spec, download=False)
        if src is None:
            return StageFacts(None)
        req = self._full(ctx, self._request(ctx, spec, src, "check"))
        return StageFacts(src, ctx.fact(StagedCopy, json.dumps(req, sort_keys=True)))

    def decide(self, facts: StageFacts, opts: StageOptions) -> Finding:
        src, out = facts.source, facts.check or {}
        if src is None:
            return Finding.drift(
                f"{opts.repo} is not in the HF cache yet",
                cause="never downloaded",
                repair="gpubox stage BOX downloads and stages it",
                plan=Plan(actions=[StageCopy(self, None)]),
                evidence=StageEvidence(opts.source, opts.dest),
            )
        if "error" in out:
            return Finding.failed(out["error"], repair=out.get("fix"), evidence=StageEvidence(src, opts.dest))
        ev = StageEvidence(
            src,
            opts.dest,
            out["files"],
            out["bytes"],
            out["verified"],
            out["problems"],
            out.get("hashes", []),
        )
        if out["staged"]:
            how = f", {out['verified']} hashes verified" if opts.verify else ""
            return Finding.ok(
                f"{opts.dest}: staged, {out['files']} files, {_gb(out['bytes'])}{how}", evidence=ev
            )
        probs = out["problems"]
        more = f" (+{len(probs) - 1} more)" if len(probs) > 1 else ""
        if probs[0].startswith("manifest absent"):
            cause = "tmpfs is empty after a reboot, or a copy was interrupted"
        elif out["source_changed"]:
            cause = "the persistent copy was updated"
        else:
            cause = "the staged copy was damaged or modified"
        return Finding.drift(
            f"{opts.dest}: {probs[0]}{more}",
            cause=cause,
            repair=f"gpubox stage {opts.box}",
            plan=Plan(actions=[StageCopy(self, src)]),
            evidence=ev,
        )


@dataclass
class StageCopy(Action):
    """Stage a model with the copier (provision.stage), where the container's files are.

    prepare: the copier's dry run (which files would be copied, how many bytes, what is removed
    or refused); a dry run shows its file list as the diff and `gpubox stage SRC DEST`, the
    command that makes the same copy by hand. execute: the copy (with --force: also when the room
    check refuses), progress on the console. verified: the re-check, with the copy's summary as
    the evidence's `staged`. With no source (a repo id not in the HF cache yet) it downloads it
    first and there is no dry run to show."""

    step: "StageStep"
    src: str | None  # the logical source directory; None: download the repo first
    where: str | None = "container"
    spec: dict | None = None  # the model setting, read by prepare
    what: str = ""  # the summary, from the dry run
    listing: str = ""  # the dry run's file list (the diff a dry run shows)
    argv: list[str] = field(default_factory=list)
    copied: dict | None = None  # the copier's summary, after execute

    def prepare(self, run: Execution) -> None:
        ctx, step = run.ctx, self.step
        self.spec = spec = model_spec(ctx, step.var)
        if self.src is None:
            self.what = f"download {spec['repo']} into the HF cache, then stage it to {spec['dest']}"
            return
        out = step._call(ctx, {**step._request(ctx, spec, self.src, "stage"), "dry_run": True})
        if "error" in out:
            raise GpuboxError(out["error"], out.get("fix"))
        desc = (
            f"copy {len(out['would_copy'])} file(s) ({_gb(out['would_copy_bytes'])}) "
            f"from {self.src} to {spec['dest']}"
        )
        if out.get("removed"):
            desc += f", remove {len(out['removed'])} stale file(s)"
        if out.get("would_chmod"):
            desc += f", set the source's permissions on {len(out['would_chmod'])} file(s)"
        if out.get("room_problem") and not ctx.opt("force"):
            desc += f" - refused: {out['room_problem']}"
        # "before:": the same listing is the dry run's plan and, after apply, the diff of what was done
        listing = "\n".join(f"+ {r}  (before: {why})" for r, why in sorted(out["reasons"].items()))
        listing += "".join(
            f"\n+ {r}  (link out of the source -> {t})" for r, t in (out.get("links_out") or {}).items()
        )
        argv = ["gpubox", "stage", self.src, spec["dest"]] + (["--verify"] if ctx.opt("verify") else [])
        if spec["hash"] and spec["hash"] != engine.DEFAULT_HASH:
            argv += ["--hash", spec["hash"]]
        self.what, self.listing, self.argv = desc, listing, argv

    def summary(self) -> str:
        return self.what

    def describe(self, host) -> list[list[str]]:
        return [list(self.argv)] if self.argv else []

    def diff(self) -> str:
        return self.listing

    def execute(self, run: Execution) -> None:
        ctx, step = run.ctx, self.step
        spec = self.spec or model_spec(ctx, step.var)
        src = self.src or step._source(ctx, spec, download=True)
        progress = None
        if ctx.console is not None:  # local: in-process; remote: relayed from the copier's lines
            progress = engine.rich_progress(ctx.console)
        req = {**step._request(ctx, spec, src, "stage"), "force": bool(ctx.opt("force"))}
        out = step._call(ctx, req, progress)
        if "error" in out:
            raise GpuboxError(out["error"], out.get("fix"))
        self.copied = out

    def verified(self, recheck) -> Finding:
        f = recheck()
        if self.copied is not None and isinstance(f.evidence, StageEvidence):
            f.evidence.staged = self.copied
        return f


def summaries(report) -> list[dict]:
    """The copy summaries of the stage steps that copied (in step order), moved out of their
    step records into the report's `staged` list (`gpubox stage --json`, the Ansible module)."""
    out = []
    for s in report.steps:
        if isinstance(s.evidence, dict) and "staged" in s.evidence:
            out.append(s.evidence.pop("staged"))
    return out


STEPS = (("model-stage", "gpubox_model", True), ("drafter-stage", "gpubox_drafter", False))


def steps(ctx) -> list[Step]:
    """The stage steps for the box's gpubox_model and gpubox_drafter (those that are set)."""
    return [StageStep(name, var, tok) for name, var, tok in STEPS if model_spec(ctx, var) is not None]
