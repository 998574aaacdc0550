"""The `gpubox` command line. Subcommands live next to the code they drive and load lazily,
so `gpubox inventory list` does not pay for importing the benchmark or plotting stack."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys

import click

from . import __version__, areas
from .errors import GpuboxError
from .escape import terminal

# command name -> "module:attribute". The areas' commands come from their registrations
# (gpubox.areas), still as strings: nothing loads until a command is run. A registered module that
# is not importable (a stale registration, or one added by a plugin that is not installed) is
# left out of --help and answers "No such command" instead of a traceback (LazyGroup).
COMMANDS = {
    "inventory": "gpubox.cli_inventory:inventory",
    "sim": "gpubox.cli_sim:sim",
    **areas.commands(),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        names = []
        for name, target in COMMANDS.items():
            mod = target.split(":")[0]
            try:
                if importlib.util.find_spec(mod) is not None:
                    names.append(name)
            except ModuleNotFoundError:
                pass
        return sorted(names)

    def resolve_command(self, ctx, args):
        """click's own did-you-mean looks in `self.commands`, which a lazy group leaves empty:
        suggest from the registered names instead (`gpubox docter` -> 'doctor')."""
        name = click.utils.make_str(args[0])
        if self.get_command(ctx, name) is None and not name.startswith("-"):
            import difflib

            close = difflib.get_close_matches(name, self.list_commands(ctx), n=2, cutoff=0.6)
            hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
            ctx.fail(f"No such command {name!r}.{hint}")
        return super().resolve_command(ctx, args)

    def get_command(self, ctx, name):
        target = COMMANDS.get(name)
        if target is None:
            return None
        mod, attr = target.split(":")
        try:
            module = importlib.import_module(mod)
        except ModuleNotFoundError as exc:
            if exc.name == mod:
                return None
            raise
        cmd = getattr(module, attr, None)
        if cmd is not None:
            from .completion import attach_box_completion

            attach_box_completion(cmd)
        return cmd


class State:
    def __init__(self, inventory: str | None, verbose: int):
        self.inventory_path = inventory
        self.verbose = verbose
        self._inventory = None

    @property
    def inventory(self):
        if self._inventory is None:
            from .inventory import Inventory

            self._inventory = Inventory(self.inventory_path)
            from .cli_sim import load_for

            load_for(self._inventory)
        return self._inventory


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "-i",
    "--inventory",
    "inventory",
    metavar="PATH",
    envvar="GPUBOX_INVENTORY",
    help="Ansible YAML inventory file or directory (default: ./inventory or $GPUBOX_INVENTORY).",
)
@click.option("-v", "--verbose", count=True, help="More detail; tracebacks on errors.")
@click.version_option(__version__, prog_name="gpubox")
@click.pass_context
def cli(ctx: click.Context, inventory: str | None, verbose: int) -> None:
    """Bring a GPU inference box back to a known-good, fast state after a reboot, and prove it.

    Exit status: 0 healthy/ok, 1 problems found or remaining, 2 bad input or could not run,
    130 interrupted.
    """
    ctx.obj = State(inventory, verbose)


def hoist_global_options(args: list[str]) -> list[str]:
    """Let `-i/--inventory PATH` and `-v` stand anywhere (`gpubox inventory list -i inv.yml`, as
    with ansible-playbook): click only takes a group's options before the subcommand, so move
    them there. No subcommand uses these spellings for anything else; `--` ends the scan."""
    front: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            rest += args[i:]
            break
        if a in ("-i", "--inventory") and i + 1 < len(args):
            front += [a, args[i + 1]]
            i += 2
            continue
        if a.startswith("--inventory=") or a == "--verbose" or (a.startswith("-v") and set(a[1:]) == {"v"}):
            front.append(a)
        else:
            rest.append(a)
        i += 1
    return front + rest


def usage_line(exc: click.UsageError) -> str:
    """A usage error as one line plus the hint (click prints usage, hint and error on three)."""
    ctx = exc.ctx
    path = ctx.command_path if ctx is not None else "gpubox"
    msg = " ".join(exc.format_message().split())
    return f"{path}: error: {msg} (see '{path} --help')"


def interrupted(exc: BaseException) -> None:
    """Ctrl-C anywhere: what was already changed (when steps ran), then exit 130 at once.

    os._exit, not sys.exit: a pipeline lane may be blocked in a prompt's read of stdin (the
    container restart asks in the lane that runs it); the interpreter's shutdown would then wait
    for that stream's lock and abort ("Fatal Python error: _enter_buffered_busy", exit 134)."""
    from .errors import Interrupted

    while not isinstance(exc, Interrupted) and (exc.__cause__ or exc.__context__) is not None:
        exc = exc.__cause__ or exc.__context__  # click re-raises Ctrl-C as Abort from it
    lines = exc.summary() if isinstance(exc, Interrupted) else []
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        pass
    msg = "\ngpubox: interrupted" + "".join(f"\n  {line}" for line in lines) + "\n"
    try:
        os.write(2, msg.encode(errors="replace"))
    except OSError:
        pass
    import threading

    if threading.active_count() > 1:  # a lane (or a prompt in it) still runs: leave at once
        os._exit(130)
    sys.exit(130)


def main(argv: list[str] | None = None) -> None:
    """Entry point: every GpuboxError becomes one line on stderr and exit status 2."""
    args = hoist_global_options(list(argv if argv is not None else sys.argv[1:]))
    verbose = any(a == "--verbose" or (a.startswith("-v") and set(a[1:]) == {"v"}) for a in args)
    try:
        rc = cli.main(args=args, prog_name="gpubox", standalone_mode=False)
    except GpuboxError as exc:
        if verbose:
            import traceback

            traceback.print_exc()
        click.echo(f"gpubox: error: {terminal(exc)}", err=True)  # server/document text: no raw escapes
        sys.exit(exc.exit_code)
    except (click.exceptions.Abort, KeyboardInterrupt) as exc:
        # click turns Ctrl-C into Abort; either way it is SIGINT: 128 + 2, as shells report it.
        interrupted(exc)
    except click.UsageError as exc:
        click.echo(usage_line(exc), err=True)
        sys.exit(2)
    except click.ClickException as exc:
        click.echo(f"gpubox: error: {' '.join(exc.format_message().split())}", err=True)
        sys.exit(2)
    except UnicodeDecodeError as exc:
        click.echo(
            f"gpubox: error: input is not UTF-8 text: byte 0x{exc.object[exc.start]:02x} at offset "
            f"{exc.start} (re-save it as UTF-8)",
            err=True,
        )
        sys.exit(2)
    except UnicodeEncodeError as exc:  # e.g. a non-UTF-8 file name (surrogate-escaped) printed
        click.echo(
            f"gpubox: error: a name is not UTF-8 text ({exc.object[exc.start : exc.end]!a}); rename it "
            "(or set a UTF-8 locale)",
            err=True,
        )
        sys.exit(2)
    except OSError as exc:
        from .errors import os_error

        click.echo(f"gpubox: error: {terminal(os_error(exc))}", err=True)
        sys.exit(2)
    except Exception as exc:  # a bug or an unforeseen state: still one line, and "could not run"
        if verbose:
            import traceback

            traceback.print_exc()
        msg = " ".join(f"{type(exc).__name__}: {exc}".split())
        click.echo(
            f"gpubox: internal error: {msg} (re-run with -v for the traceback and report it)", err=True
        )
        sys.exit(2)
    sys.exit(rc if isinstance(rc, int) else 0)


if __name__ == "__main__":
    main()
