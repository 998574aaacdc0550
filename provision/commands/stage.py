"""`gpubox stage BOX` (the box's model + drafter into /dev/shm) and `gpubox stage SRC DEST`."""

from __future__ import annotations

import sys

import click

from gpubox.clihelp import box_context, dry_run_option, emit, json_option
from gpubox.errors import GpuboxError
from gpubox.output import console, print_json


@click.command("stage")
@click.argument("target", metavar="BOX|SRC")
@click.argument("dest", required=False, metavar="[DEST]")
@dry_run_option
@click.option(
    "--verify", is_flag=True, help="Re-hash every staged file against the manifest (re-copies mismatches)."
)
@click.option(
    "--force", is_flag=True, help="Stage even when space/memory is short or the source fails its check."
)
@click.option("--workers", type=click.IntRange(1, 64), help="Copy threads (default: CPU count, 2..16).")
@click.option(
    "--hash",
    "hash_name",
    type=click.Choice(["xxh3", "crc32", "sha256"]),
    default=None,
    help="Chunk hash for the files copied: xxh3 (default; catches accidental corruption, fastest), "
    "crc32 (stdlib) or sha256. BOX: also gpubox_stage_hash. Staged files keep theirs for checks and --verify.",
)
@click.option(
    "--follow-links",
    is_flag=True,
    help="Stage files that are symlinks out of the source (refused by default; listed then).",
)
@click.option("--drafter", is_flag=True, help="SRC DEST only: a drafter model (no tokenizer required).")
@json_option
@click.pass_context
def stage(
    ctx: click.Context,
    target: str,
    dest: str | None,
    dry_run: bool,
    verify: bool,
    force: bool,
    workers: int | None,
    hash_name: str | None,
    follow_links: bool,
    drafter: bool,
    as_json: bool,
) -> None:
    """Stage a model into tmpfs: parallel, hash-verified, atomic (manifest last), resumable.

    \b
    gpubox stage BOX            the box's gpubox_model and gpubox_drafter, in the container
    gpubox stage SRC DEST       a local copy, e.g. /mnt/models/Qwen3.6-27B /dev/shm/Qwen3.6-27B

    A second run copies nothing; an interrupted one resumes. Exit 0 staged, 1 not staged
    (--dry-run found work), 2 could not run (no room, another stager, bad source).
    """
    if dest is None:
        from gpubox.pipeline import run_steps

        from ..stage_step import steps, summaries

        c = box_context(
            ctx,
            target,
            dry_run=dry_run,
            verify=verify,
            force=force,
            workers=workers,
            as_json=as_json,
            hash=hash_name,
            follow_links=follow_links,
        )
        todo = steps(c)
        if not todo:
            raise GpuboxError(
                f"box {target} sets neither gpubox_model nor gpubox_drafter",
                "add gpubox_model: {source: /mnt/models/NAME, dest: /dev/shm/NAME} to its inventory",
            )
        try:
            report = run_steps(c, todo, "plan" if dry_run else "apply")
        finally:
            c.close()
        sums = summaries(report)
        if sums:
            report.extra["staged"] = sums
        emit(report, as_json, title=f"{target}: stage" + (" (dry run)" if dry_run else ""))
        return
    _local(
        target,
        dest,
        dry_run=dry_run,
        verify=verify,
        force=force,
        workers=workers,
        require_tokenizer=not drafter,
        as_json=as_json,
        hash=hash_name,
        follow_links=follow_links,
    )


def _local(src: str, dest: str, *, as_json: bool, **kw) -> None:
    from .. import stage as engine

    progress = None
    if not as_json and not kw["dry_run"] and sys.stderr.isatty():
        progress = engine.rich_progress(console(stderr=True))
    try:
        out = engine.stage(src, dest, progress=progress, **kw)
    except engine.StageError as exc:
        raise GpuboxError(exc.problem, exc.fix) from None
    except OSError as exc:
        raise GpuboxError(
            f"{exc.filename or f'staging {src} -> {dest}'}: {exc.strerror or exc}",
            "check the paths and permissions",
        ) from None
    rc = 1 if (kw["dry_run"] and (out["would_copy"] or out.get("room_problem"))) else 0
    if as_json:
        print_json(out)
        sys.exit(rc)
    con = console()
    if kw["dry_run"]:
        con.print(
            f"would copy {len(out['would_copy'])} of {out['files']} file(s), "
            f"{engine.size_text(out['would_copy_bytes'])} of {engine.size_text(out['bytes'])}, into {out['dest']}"
        )
        for rel in out["would_copy"]:
            con.print(f"  + {rel}  ({out['reasons'][rel]})")
        for rel in out["removed"]:
            con.print(f"  - {rel}  (no longer in the source)")
        if out.get("room_problem"):
            con.print(f"[red]would be refused:[/] {out['room_problem']}")
        if kw["verify"]:
            con.print(f"verified {out['verified']} staged file(s)")
    else:
        from rich.table import Table

        t = Table(title=f"staged {out['dest']} ({out['hash']})")
        for col in ("files", "copied", "skipped", "verified", "bytes copied", "seconds", "GB/s"):
            t.add_column(col, justify="right")
        t.add_row(
            str(out["files"]),
            str(out["copied"]),
            str(out["skipped"]),
            str(out["verified"]),
            engine.size_text(out["copied_bytes"]),
            f"{out['seconds']:.2f}",
            f"{out['gb_s']:.2f}",
        )
        con.print(t)
        for rel, why in sorted(out["reasons"].items()):
            con.print(f"  copied {rel}: {why}")
    for rel, target in (out.get("links_out") or {}).items():
        con.print(f"  followed link out of the source: {rel} -> {target}", markup=False, soft_wrap=True)
    for rel in out.get("modes_fixed") or out.get("would_chmod") or []:
        con.print(
            f"  {'permissions set' if out.get('modes_fixed') else 'would set permissions'} "
            f"as in the source: {rel}",
            markup=False,
            soft_wrap=True,
        )
    sys.exit(rc)
