"""The request runner and the copier's own command line: one operation described as data (what
travels to a remote container as --request JSON), and `python3 -m gpubox.provision.stage SRC DEST`
printing its JSON summary."""

from __future__ import annotations

import json
import sys

from .errors import StageError
from .hashing import DEFAULT_HASH, HASHES
from .operations import check, stage
from .progress import LineProgress, rich_progress


def run_request(req: dict, progress=None) -> dict:
    """One operation described as data (what travels to a remote container as --request JSON)."""
    op = req.get("op", "stage")
    common = {
        "verify": bool(req.get("verify")),
        "require_tokenizer": req.get("require_tokenizer", True),
        "workers": req.get("workers"),
        "follow_links": bool(req.get("follow_links")),
    }
    if op == "check":
        return check(req["src"], req["dest"], **common)
    if op == "stage":
        return stage(
            req["src"],
            req["dest"],
            force=bool(req.get("force")),
            dry_run=bool(req.get("dry_run")),
            cgroup_dir=req.get("cgroup_dir"),
            tmpfs=req.get("tmpfs"),
            source_info=req.get("source_info"),
            progress=progress,
            hash=req.get("hash"),
            **common,
        )
    raise StageError(f"unknown operation {op!r}", "use check or stage")


def main(argv: list[str] | None = None) -> int:
    """`stage.py SRC DEST [--verify] [--force] [--dry-run] [--check] [--hash crc32|sha256]` or
    `--request JSON`; prints JSON.
    Exit 0 done/staged, 1 not staged (--check), 2 could not run."""
    import argparse

    ap = argparse.ArgumentParser(
        prog="stage.py",
        description="Stage a model directory into tmpfs: fast, hash-verified, atomic, resumable.",
    )
    ap.add_argument("src", nargs="?")
    ap.add_argument("dest", nargs="?")
    ap.add_argument("--request", help="the operation as JSON (used by gpubox)")
    ap.add_argument("--verify", action="store_true")
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--workers", type=int)
    ap.add_argument("--follow-links", action="store_true", help="stage files linked from outside the source")
    ap.add_argument(
        "--hash", choices=sorted(HASHES), help=f"chunk hash for copied files (default {DEFAULT_HASH})"
    )
    args = ap.parse_args(argv)
    if args.request:
        req = json.loads(args.request)
    elif args.src and args.dest:
        req = {
            "op": "check" if args.check else "stage",
            "src": args.src,
            "dest": args.dest,
            "verify": args.verify,
            "force": args.force,
            "dry_run": args.dry_run,
            "workers": args.workers,
            "hash": args.hash,
            "follow_links": args.follow_links,
        }
    else:
        ap.error("give SRC DEST or --request JSON")
    progress = rich_progress() if sys.stderr.isatty() else None
    if req.get("progress") == "lines":  # run by gpubox on another host: it relays these lines live
        progress = LineProgress()
    try:
        out = run_request(req, progress)
    except StageError as exc:
        print(json.dumps({"error": exc.problem, "fix": exc.fix}))
        return 2
    except OSError as exc:
        print(
            json.dumps(
                {
                    "error": f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": "),
                    "fix": "check the paths and permissions",
                }
            )
        )
        return 2
    print(json.dumps(out))
    return 0 if out.get("staged", True) else 1
