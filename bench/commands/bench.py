"""`gpubox bench BOX [...]` and `gpubox bench run --url URL [...]`."""

from __future__ import annotations

import sys

import click

from gpubox.clihelp import box_context, json_option, state
from gpubox.errors import GpuboxError
from gpubox.output import console, print_json


def _csv(value: str | None, cast=str) -> list | None:
    if not value:
        return None
    try:
        return [cast(v.strip()) for v in value.split(",") if v.strip()]
    except ValueError:
        raise GpuboxError(f"bad list {value!r}", "give comma-separated values, e.g. --tp 1,4,8") from None


def _load_profile(path: str) -> dict:
    """One profile from a YAML file, checked to be a mapping with a workloads list."""
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            d = yaml.safe_load(f)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise GpuboxError(
            f"cannot read profile file {path}: {type(exc).__name__}", "give a readable UTF-8 YAML file"
        ) from None
    if not isinstance(d, dict) or not isinstance(d.get("workloads"), list):
        raise GpuboxError(
            f"profile file {path} has no 'workloads' list",
            "write e.g. workloads: [{kind: decode, output_lens: [256]}]",
        )
    return d


def render(doc: dict, con=None) -> None:
    """A table of measurements and the verdict with its reasons."""
    from rich.markup import escape
    from rich.table import Table

    con = con or console()
    sim = f" [yellow](SIMULATED server, speed x{doc.get('sim_speed')})[/]" if doc.get("simulated") else ""
    t = Table(title=f"{doc['box']} benchmark: {doc['profile']}{sim}")
    for col, j in (
        ("measurement", "left"),
        ("status", "left"),
        ("tok/s", "right"),
        ("spread", "right"),
        ("agg tok/s", "right"),
        ("TTFT p50 s", "right"),
        ("TPOT p50 ms", "right"),
        ("tok/chunk", "right"),
        ("accept len", "right"),
    ):
        t.add_column(col, justify=j)

    def f(x, nd=1):
        return "-" if x is None else f"{x:.{nd}f}"

    for m in doc["measurements"]:
        st = {"ok": "green", "failed": "bold red", "skipped": "dim"}.get(m["status"], "")
        sp = m.get("tok_s_spread")
        acc = m.get("acceptance")
        t.add_row(
            escape(m["key"]),
            f"[{st}]{m['status']}[/]",
            f(m.get("tok_s")),
            "-" if not sp else f"{sp[0]:.0f}-{sp[1]:.0f}",
            f(m.get("aggregate_tok_s")),
            f((m.get("ttft_s") or {}).get("p50"), 3),
            f((m.get("tpot_ms") or {}).get("p50"), 2),
            f(m.get("tokens_per_chunk"), 2),
            "absent" if acc is None else f(acc.get("mean_length"), 2),
        )
    con.print(t)
    for s in doc["servers"]:
        if s["status"] == "failed":
            con.print(
                f"[bold red]TP{s['tp']} {escape(s['label'])} server failed:[/] {escape(str(s['error']))}"
            )
            if s.get("log_tail"):
                con.print("[dim]" + escape(s["log_tail"]) + "[/]")
    for m in doc["measurements"]:
        if m["status"] != "ok" and m.get("reason"):
            con.print(f"[dim]{escape(m['key'])}: {escape(m['reason'])}[/]")
    v = doc["verdict"]
    colour = {"healthy": "green", "degraded": "yellow", "failed": "bold red"}[v["status"]]
    con.print(f"verdict: [{colour}]{v['status']}[/]")
    for r in v["reasons"]:
        con.print(f"  - {escape('[' + r['level'] + ']')} {escape(r['message'])}")
    if doc.get("path"):
        con.print(f"[dim]result: {escape(doc['path'])}[/]")


def _emit(doc: dict, as_json: bool) -> None:
    from ..verdict import exit_code

    if as_json:
        print_json(doc)
    else:
        render(doc)
    sys.exit(exit_code(doc["verdict"]))


class BenchGroup(click.Group):
    """`bench BOX ...` runs the hidden `box` command; `bench run ...` the subcommand."""

    def parse_args(self, ctx, args):
        if args and args[0] not in self.commands and args[0] not in ("-h", "--help"):
            args = ["box", *args]
        return super().parse_args(ctx, args)


@click.group(cls=BenchGroup)
def bench() -> None:
    """Benchmark the inference server at TP1/4/8 and give a health verdict.

    \b
      gpubox bench BOX [--profile health|full] [--tp 1,4,8] [--methods auto,ddtree:15] [--out DIR] [--json]
      gpubox bench run --url URL [--model NAME] [--tp N] [--method ddtree:15] [--profile health] [--json]

    Exit status: 0 healthy, 1 degraded or failed, 2 bad input or could not run.
    """


@bench.command("box", hidden=True)
@click.argument("box_name", metavar="BOX")
@click.option(
    "--profile", default=None, help="health (default) | full | a profile from gpubox_bench.profiles."
)
@click.option("--tp", "tp", default=None, help="TP sizes, comma-separated (default from the profile).")
@click.option("--methods", default=None, help="Methods, comma-separated: auto, linear[:B], ddtree[:B].")
@click.option("--out", "out", default=None, type=click.Path(file_okay=False), help="Result directory.")
@json_option
@click.pass_context
def bench_box(ctx, box_name, profile, tp, methods, out, as_json):
    """Launch the server at each TP x method on BOX, measure, verdict."""
    from ..runner import run_box
    from ..runonce import run_lock

    c = box_context(ctx, box_name, as_json=as_json)
    try:
        with run_lock(c):  # never overlap a scheduled health check of the same box
            doc = run_box(c, profile=profile, out_dir=out, tps=_csv(tp, int), methods=_csv(methods))
    finally:
        c.close()
    _emit(doc, as_json)


@bench.command("run")
@click.option("--url", required=True, help="Base URL of a running OpenAI-compatible server.")
@click.option(
    "--model",
    default=None,
    help="The model to ask for (default: the first the server lists; needed where it lists none).",
)
@click.option("--box", "box_name", default=None, help="Inventory box whose expectations apply (optional).")
@click.option("--tp", "tp", default=1, type=int, show_default=True, help="The TP size the server runs at.")
@click.option(
    "--method", default="custom", show_default=True, help="What the server runs: auto, linear:B, ddtree:B."
)
@click.option("--profile", default="health", show_default=True)
@click.option(
    "--profile-file",
    default=None,
    type=click.Path(dir_okay=False),
    help="YAML file with one profile's keys (workloads, repetitions, ...): no inventory needed.",
)
@click.option("--concurrency", default=None, help="Concurrency sweep, comma-separated (e.g. 1,8,32).")
@click.option("--output-len", default=None, type=int, help="Output tokens per request (every workload).")
@click.option("--prompt-len", default=None, type=int, help="Prompt tokens per request.")
@click.option(
    "--tokenizer",
    default=None,
    type=click.Path(),
    help="Model directory (or tokenizer.json) to size prompts with, instead of asking the server.",
)
@click.option(
    "--timeout", default=120.0, show_default=True, help="Seconds without data before a request fails."
)
@click.option("--out", "out", default=None, type=click.Path(file_okay=False))
@json_option
@click.pass_context
def bench_run(
    ctx,
    url,
    model,
    box_name,
    tp,
    method,
    profile,
    profile_file,
    concurrency,
    output_len,
    prompt_len,
    tokenizer,
    timeout,
    out,
    as_json,
):
    """Measure an already running server (no launch, no teardown).

    Without --box the run's history is this server's own (URL + model id)."""
    from ..runner import run_url

    settings, expect, name = {}, None, None
    if box_name:
        box = state(ctx).inventory.box(box_name)
        settings = dict(box.var("gpubox_bench", {}) or {})
        expect, name = settings.get("expect"), box_name
    if profile_file:
        settings = {
            **settings,
            "profiles": {**(settings.get("profiles") or {}), "file": _load_profile(profile_file)},
        }
        profile = "file"
    overrides = {"concurrency": _csv(concurrency, int), "output_len": output_len, "prompt_len": prompt_len}
    doc = run_url(
        url,
        profile=profile,
        out_dir=out,
        tp=tp,
        method=method,
        box=name,
        expect=expect,
        timeout=timeout,
        settings=settings,
        console=None if as_json else console(stderr=True),
        tokenizer_dir=tokenizer,
        overrides={k: v for k, v in overrides.items() if v is not None},
        model=model,
    )
    _emit(doc, as_json)
