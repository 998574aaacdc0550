"""The `gpubox` command line: the root group, global options and the one error/exit policy.

Every command is one module named for it: `gpubox/commands/<command>.py` for the core's (listed in
COMMANDS below), `<area>/commands/<command>.py` for an area's (listed in its `area.py`), each as
"module:attr" and loaded lazily, so `gpubox inventory list` does not pay for importing the benchmark
or plotting stack (docs/architecture.md, "How to add a command")."""

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
    "inventory": "gpubox.commands.inventory:inventory",
    "sim": "gpubox.commands.sim:sim",
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
            from .suggest import hint

            ctx.fail(f"No such command {name!r}.{hint(name, self.list_commands(ctx))}")
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
            adopt_state_dir(self._inventory)
            from .commands.sim import load_for

            load_for(self._inventory)
        return self._inventory


STATE_VAR = "gpubox_control_state_dir"


def adopt_state_dir(inv) -> None:
    """An inventory may name the control node's state directory for its boxes (backups, history,
    results, locks) with `gpubox_control_state_dir` in `all: vars:` (a relative path is taken
    from the inventory's folder). A simulated box's inventory names its own, so each practice box
    keeps its own history and records. $GPUBOX_STATE_DIR, when set, still wins."""
    if os.environ.get("GPUBOX_STATE_DIR"):
        return
    values = {str(h.vars[STATE_VAR]) for h in inv.hosts.values() if h.vars.get(STATE_VAR)}
    if len(values) > 1:
        raise GpuboxError(
            f"{inv.path}: {STATE_VAR} differs between hosts ({', '.join(sorted(values))})",
            "set it once, under all: vars:",
        )
    if values:
        base = inv.path if inv.path.is_dir() else inv.path.parent
        os.environ["GPUBOX_STATE_DIR"] = str((base / values.pop()).resolve())


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


def _prefer_prefixes(exc: click.UsageError) -> None:
    """An unknown option that is the start of known ones suggests those only: `--dry` means
    --dry-run, not --yes (click's close matches rank by shared letters)."""
    if not isinstance(exc, click.NoSuchOption) or exc.ctx is None:
        return
    names = [o for p in exc.ctx.command.params for o in (*p.opts, *p.secondary_opts) if o.startswith("--")]
    prefixed = sorted(n for n in names if n.startswith(exc.option_name) and n != exc.option_name)
    if exc.option_name.startswith("--") and prefixed:
        exc.possibilities = prefixed


def usage_line(exc: click.UsageError) -> str:
    """A usage error as one line plus the hint (click prints usage, hint and error on three)."""
    _prefer_prefixes(exc)
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
    # Every command checks afresh on its next run and a staging copy resumes from its journal: say so,
    # so that an interrupted stage or recover is re-run rather than cleaned up by hand.
    lines = [
        *lines,
        "re-run the same command to go on: it checks everything again, and a copy resumes where it stopped",
    ]
    msg = "\ngpubox: interrupted" + "".join(f"\n  {line}" for line in lines) + "\n"
    try:
        os.write(2, msg.encode(errors="replace"))
    except OSError:
        pass
    import threading

    if threading.active_count() > 1:  # a lane (or a prompt in it) still runs: leave at once
        os._exit(130)
    sys.exit(130)


def fail(line: str, code: int = 2, *, as_json: bool = False) -> None:
    """The one way a run ends in error: one line on stderr and, under --json, the same as a JSON
    object on stdout (a machine reading stdout gets an answer it can parse, not an empty stream)."""
    click.echo(line, err=True)
    if as_json:
        import json

        click.echo(json.dumps({"error": line, "exit_code": code}))
    sys.exit(code)


def main(argv: list[str] | None = None) -> None:
    """Entry point: every GpuboxError becomes one line on stderr and exit status 2."""
    args = hoist_global_options(list(argv if argv is not None else sys.argv[1:]))
    verbose = any(a == "--verbose" or (a.startswith("-v") and set(a[1:]) == {"v"}) for a in args)
    as_json = "--json" in args[: args.index("--")] if "--" in args else "--json" in args
    try:
        rc = cli.main(args=args, prog_name="gpubox", standalone_mode=False)
    except GpuboxError as exc:
        if verbose:
            import traceback

            traceback.print_exc()
        # server/document text: no raw escapes
        fail(f"gpubox: error: {terminal(exc)}", exc.exit_code, as_json=as_json)
    except (click.exceptions.Abort, KeyboardInterrupt) as exc:
        # click turns Ctrl-C into Abort; either way it is SIGINT: 128 + 2, as shells report it.
        interrupted(exc)
    except click.UsageError as exc:
        fail(usage_line(exc), as_json=as_json)
    except click.ClickException as exc:
        fail(f"gpubox: error: {' '.join(exc.format_message().split())}", as_json=as_json)
    except UnicodeDecodeError as exc:
        fail(
            f"gpubox: error: input is not UTF-8 text: byte 0x{exc.object[exc.start]:02x} at offset "
            f"{exc.start} (re-save it as UTF-8)",
            as_json=as_json,
        )
    except UnicodeEncodeError as exc:  # e.g. a non-UTF-8 file name (surrogate-escaped) printed
        fail(
            f"gpubox: error: a name is not UTF-8 text ({exc.object[exc.start : exc.end]!a}); rename it "
            "(or set a UTF-8 locale)",
            as_json=as_json,
        )
    except OSError as exc:
        from .errors import os_error

        fail(f"gpubox: error: {terminal(os_error(exc))}", as_json=as_json)
    except Exception as exc:  # a bug or an unforeseen state: still one line, and "could not run"
        if verbose:
            import traceback

            traceback.print_exc()
        msg = " ".join(f"{type(exc).__name__}: {exc}".split())
        fail(
            f"gpubox: internal error: {msg} (re-run with -v for the traceback and report it)", as_json=as_json
        )
    sys.exit(rc if isinstance(rc, int) else 0)


if __name__ == "__main__":
    main()
