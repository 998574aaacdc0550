"""`gpubox backups BOX [--show N | --diff N | --restore N]`: the copies gpubox kept of the files it
changed on a box, and putting one back."""

from __future__ import annotations

import sys

import click

from gpubox.clihelp import ask, box_context, json_option
from gpubox.escape import terminal
from gpubox.output import console, print_json


@click.command()
@click.argument("box")
@click.option("--show", "show", type=int, metavar="N", help="Print backup N as it was kept.")
@click.option("--diff", "diff_", type=int, metavar="N", help="What restoring backup N would change.")
@click.option("--restore", "restore_", type=int, metavar="N", help="Put backup N back (asks first; --yes).")
@click.option("--dry-run", is_flag=True, help="With --restore: show the diff, change nothing.")
@click.option("--yes", "-y", is_flag=True, help="Restore without asking.")
@json_option
@click.pass_context
def backups(click_ctx, box: str, show, diff_, restore_, dry_run, yes, as_json) -> None:
    """The backups gpubox kept of BOX's files (its Proxmox host's and its container's), newest first.

    Every file gpubox changes is copied to the control node first. --diff N shows what putting
    backup N back would change; --restore N does it (the container config through Proxmox's lock;
    the file it replaces is backed up in turn, so a restore can be undone the same way)."""
    from ..backups import content, diff, find, pick, restore

    if sum(x is not None for x in (show, diff_, restore_)) > 1:
        raise click.UsageError("give one of --show, --diff, --restore")
    ctx = box_context(click_ctx, box, as_json=as_json)
    con = console()
    try:
        if show is not None:
            b = pick(ctx.box, show)
            sys.stdout.write(terminal(content(b).decode(errors="replace"), newlines=True))
            return
        if diff_ is not None or restore_ is not None:
            b = pick(ctx.box, diff_ if diff_ is not None else restore_)
            d = diff(ctx, b)
            if restore_ is None or dry_run or not d:
                if as_json:
                    print_json({**b.to_dict(), "diff": d, "changed": False})
                else:
                    sys.stdout.write(
                        terminal(d, newlines=True)
                        if d
                        else f"{b.host}:{b.path} is already as in backup {b.number}\n"
                    )
                return
            if not as_json:
                sys.stdout.write(terminal(d, newlines=True))
            if not yes:
                if not sys.stdin.isatty():
                    raise click.UsageError(
                        f"restoring backup {b.number} changes {b.host}:{b.path}: add --yes"
                    )
                if not ask(f"Put backup {b.number} back into {b.host}:{b.path}?"):
                    sys.exit(1)
            from gpubox.boxlock import box_lock

            with box_lock(ctx, what=f"restore backup {b.number}"):
                saved = restore(ctx, b)
            if as_json:
                print_json({**b.to_dict(), "diff": d, "changed": True, "replaced_backup": saved})
            else:
                con.print(
                    f"restored {terminal(b.host)}:{terminal(b.path or '')} from backup {b.number}",
                    markup=False,
                )
                if saved:
                    con.print(f"what it replaced is kept as {saved}", markup=False)
            return
        rows = find(ctx.box)
        if as_json:
            print_json([b.to_dict() for b in rows])
            return
        if not rows:
            con.print(f"no backups of {terminal(box)} in this state directory", markup=False)
            return
        from rich.table import Table

        t = Table(title=f"backups of {terminal(box)} (newest first)")
        for col in ("#", "taken", "host", "file", "bytes"):
            t.add_column(col, overflow="fold")
        for b in rows:
            t.add_row(
                str(b.number),
                b.when(),
                terminal(b.host),
                terminal(b.path or f"? ({b.file.name})"),
                str(b.file.stat().st_size),
            )
        con.print(t)
        con.print(
            f"gpubox backups {terminal(box)} --diff N  shows what putting backup N back would change",
            markup=False,
        )
    finally:
        ctx.close()
