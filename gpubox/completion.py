"""Shell completion of box names (click's completion does commands and options by itself).

Every subcommand's BOX argument completes to the boxes of the inventory the command line names
(`-i PATH`, else $GPUBOX_INVENTORY, else ./inventory). Attached when the CLI loads a command, so
the subcommand modules need no completion code of their own.
"""

from __future__ import annotations

import click

BOX_PARAMS = ("box", "box_name")


def complete_boxes(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[str]:
    """Box names starting with `incomplete`; nothing (never an error) when the inventory cannot be read,
    since a traceback in the middle of a shell prompt helps nobody."""
    from .errors import GpuboxError
    from .inventory import Inventory

    path = ctx.find_root().params.get("inventory")
    try:
        names = Inventory(path).box_names()
    except (GpuboxError, OSError):
        return []
    return [n for n in names if n.startswith(incomplete)]


def attach_box_completion(cmd: click.Command) -> click.Command:
    """Give every BOX argument of `cmd` and its subcommands the inventory's box names, unless the
    argument brings its own completion."""
    for p in cmd.params:
        if isinstance(p, click.Argument) and p.name in BOX_PARAMS and p._custom_shell_complete is None:
            p._custom_shell_complete = complete_boxes  # click keeps shell_complete= here (Parameter.__init__)
    if isinstance(cmd, click.Group):
        for sub in cmd.commands.values():
            attach_box_completion(sub)
    return cmd
