"""The nccl-env step: the box's NCCL profile in the container's files, decided purely.

Options: the profile asked for (`--nccl-profile` or gpubox_nccl_profile, loaded and validated; `auto`
picks by topology class from every known profile) and the A/B gate's verdict of `tune nccl
--measure`. Facts: the container's files (hwtune.nccl.box_files) and, where a choice depends on
it, the topology class (inventory `gpubox_topology`, else NVML in the container, else the
inventory hint gpubox_numa_nodes). A profile for another topology class is refused (issue 18:
pcie-2numa's LL/Ring halved 256 MiB all-reduce busbw on an NVLink pair); when an earlier run
installed it, the plan removes gpubox's own files of it (Remove actions: backed up, diff shown).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpubox.errors import GpuboxError
from gpubox.steps import OMIT, Finding, Omit, Plan, Remove, Step, Write

from .nccl import (
    CONF_FILE,
    ENV_FILE,
    ContainerFile,
    NvmlTopologyClass,
    Profile,
    box_files,
    errors,
    file_header,
    list_profiles,
    load_profile,
    owned_by,
    parse,
    pick_from,
    render,
    validate,
)


@dataclass
class NcclOptions:
    profile: Profile | None = None  # the profile named (validated); None when unset or auto
    auto: bool = False  # gpubox_nccl_profile: auto
    profiles: list[Profile] = field(default_factory=list)  # auto: every known profile
    files: dict[str, str] = field(default_factory=lambda: {ENV_FILE: "envfile", CONF_FILE: "ncclconf"})
    gate: dict | None = None  # `tune nccl --measure`: the A/B gate's verdict
    box: str = "BOX"


@dataclass
class NcclFacts:
    topology: str | None = None  # read only where the decision depends on it
    files: dict[str, str | None] = field(default_factory=dict)  # path -> text, None = missing


@dataclass
class NcclEvidence:
    profile: str | Omit = OMIT
    want: dict[str, str] | Omit = OMIT  # the profile's NCCL variables
    files: dict[str, dict[str, str] | None] | Omit = OMIT  # path -> what a consumer reads (None: missing)
    refused: bool | Omit = OMIT
    gate: dict[str, Any] | None | Omit = OMIT  # `tune nccl --measure`: the A/B gate's verdict
    topology: str | None | Omit = OMIT
    remove: dict[str, str] | Omit = OMIT  # a refused profile's installed files: path -> text


def chosen(opts: NcclOptions, topology: str | None) -> Profile | None:
    return pick_from(opts.profiles, topology) if opts.auto else opts.profile


def gate_refuses(gate: dict | None) -> bool:
    return bool(gate) and not gate.get("install")


def needs_topology(opts: NcclOptions) -> bool:
    """auto picks by topology; a profile written for some classes (not `any`) is checked against
    it unless the gate refused it already."""
    p = opts.profile
    return opts.auto or (
        p is not None and not gate_refuses(opts.gate) and bool(p.topologies) and "any" not in p.topologies
    )


def topology_class(ctx) -> str:
    """The inventory's `gpubox_topology`, else what NVML in the container sees (a fact), else the
    inventory hint gpubox_numa_nodes (NVLink invisible there)."""
    cls = ctx.box.var("gpubox_topology")
    if not cls:
        cls = ctx.fact(NvmlTopologyClass, bool(ctx.box.var("gpubox_simulated")))
    if not cls:
        from .links import classify_topology
        from .topology import from_inventory

        cls = classify_topology(from_inventory(ctx.box))
    return str(cls)


def gate_cause(gate: dict, profile: str) -> tuple[str, str]:
    """(cause, repair) of a refusal, from what the gate saw: a profile that was not measured is not
    "slower" -- nothing shows it helps here, which is reason enough to keep NCCL's own tuning."""
    verdicts = {r.get("verdict") for r in gate.get("rows") or []}
    keep = "keep NCCL's defaults (unset gpubox_nccl_profile)"
    if "slower" in verdicts:
        return (
            "the profile is slower than NCCL's own tuning on this box",
            f"{keep} or measure another profile",
        )
    if gate.get("fits_topology") is False:
        return (
            "the profile is written for another topology class",
            f"{keep} or use a profile for this topology",
        )
    if not verdicts or verdicts <= {"unmeasured"}:
        return (
            "nothing was measured (no TP size with more than one GPU, or the runs failed): no measurement "
            "shows the profile helps here",
            f"{keep}, or measure where NCCL runs: `gpubox probe --local --nccl-compare {profile}`",
        )
    return "the profile gains nothing measurable over NCCL's own tuning", keep


def misfit(prof: Profile, gate: dict | None, topology: str | None) -> Finding | None:
    """Refused: by the A/B gate of `tune nccl --measure`, or written for another topology class."""
    if gate_refuses(gate):
        cause, repair = gate_cause(gate, prof.name)
        return Finding.failed(
            f"profile {prof.name} refused by the A/B gate: " + " | ".join(gate["reasons"]),
            cause=cause,
            repair=repair,
            evidence=NcclEvidence(refused=True, gate=gate),
        )
    if not prof.topologies or "any" in prof.topologies:
        return None
    if topology in ("unknown", "single-gpu") or topology in prof.topologies:
        return None  # one GPU runs no collective: NCCL variables are inert there, nothing to refuse
    return Finding.failed(
        f"profile {prof.name} is for {', '.join(prof.topologies)}; this box is {topology}: not installed",
        cause="NCCL protocol/algorithm choices tuned for one topology can be slower on another",
        repair="use nccl-defaults or a profile for this topology; measure with "
        "`gpubox probe --local --nccl-compare PROFILE`",
        evidence=NcclEvidence(refused=True, topology=topology),
    )


def fatal_values(texts: dict[str, str | None], files: dict[str, str]) -> list[str]:
    """'PATH: problem' for every error in the files the server reads (a value NCCL refuses at init, a
    name it ignores, a file that cannot be parsed at all): wrong whatever profile is or is not set."""
    out = []
    for path, fmt in files.items():
        text = texts.get(path)
        if text is None:
            continue
        try:
            bad = errors(validate(parse(text, fmt)))
        except GpuboxError as exc:
            out.append(f"{path}: {exc}")
            continue
        out += [f"{path}: {i}" for i in bad]
    return out


def file_problems(text: str, fmt: str, want: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """What a consumer of this file reads, and how it differs from the profile."""
    have = parse(text, fmt)
    bad = errors(validate(have))
    names = {i.name for i in bad}
    diffs = [str(i) for i in bad]
    diffs += [f"{k} missing" for k in want if k not in have and k not in names]
    diffs += [
        f"{k}={have[k]} (want {want[k]})" for k in want if k in have and have[k] != want[k] and k not in names
    ]
    diffs += [f"{k} not in profile" for k in have if k not in want and k not in names]
    return have, diffs


class NcclEnvStep(Step):
    name = "nccl-env"
    title = "NCCL environment profile in the container"
    where = "container"
    requires = ("container",)

    def options(self, ctx) -> NcclOptions:
        name = ctx.opt("nccl_profile") or ctx.box.var("gpubox_nccl_profile")
        auto = str(name) == "auto"
        return NcclOptions(
            profile=load_profile(str(name)) if name and not auto else None,
            auto=auto,
            profiles=list(list_profiles().values()) if auto else [],
            files=box_files(ctx),
            gate=ctx.opt("nccl_gate"),
            box=ctx.box.name,
        )

    def gather(self, ctx) -> NcclFacts:
        opts = self.options(ctx)
        facts = NcclFacts(topology_class(ctx) if needs_topology(opts) else None)
        # read with or without a profile: a value NCCL refuses at init fails the server either way
        facts.files = {path: ctx.fact(ContainerFile, path) for path in opts.files}
        return facts

    def decide(self, facts: NcclFacts, opts: NcclOptions) -> Finding:
        prof = chosen(opts, facts.topology)
        if prof is None:
            fatal = fatal_values(facts.files, opts.files)
            if fatal:
                return Finding.failed(
                    "; ".join(fatal),
                    cause="NCCL stops at init on a bad NCCL_ALGO/NCCL_PROTO token and silently ignores a "
                    "misspelled name; no profile is set for this box, so gpubox leaves the files as they are",
                    repair="correct or delete the line in the file named, or set gpubox_nccl_profile "
                    f"and run `gpubox tune nccl {opts.box}`",
                    evidence=NcclEvidence(files=dict(facts.files)),
                )
            if opts.auto:
                return Finding.ok(
                    f"auto: no profile for this topology ({facts.topology}): NCCL's own tuning",
                    evidence=NcclEvidence(),
                )
            return Finding.ok(
                "gpubox_nccl_profile not set: NCCL runs on its defaults", evidence=NcclEvidence()
            )
        refused = misfit(prof, opts.gate, facts.topology)
        if refused:
            owned = {p: t for p, t in facts.files.items() if owned_by(prof.name, t)}
            if not owned:
                return refused
            # refused, yet installed by an earlier run: take gpubox's own files out (backed up)
            refused.evidence.remove = owned
            return Finding.drift(
                f"{refused.detail}; gpubox's files of it are installed: {', '.join(owned)}",
                cause=refused.cause,
                repair=f"gpubox tune nccl {opts.box} (removes them)",
                evidence=refused.evidence,
                plan=Plan(
                    f"remove {', '.join(owned)} (the refused profile's files)",
                    actions=[Remove(p, old=t) for p, t in owned.items()],
                ),
            )
        want = prof.env
        problems, ev = [], NcclEvidence(prof.name, want, {})
        for path, fmt in opts.files.items():
            text = facts.files.get(path)
            if text is None:
                problems.append(f"{path} missing")
                ev.files[path] = None
                continue
            ev.files[path], diffs = file_problems(text, fmt, want)
            if diffs:
                problems.append(f"{path}: " + "; ".join(diffs))
        if not problems:
            return Finding.ok(f"profile {prof.name} in place ({', '.join(opts.files)})", evidence=ev)
        try:
            plan = _write_plan(prof, opts.files, facts.files)
        except GpuboxError as exc:  # a value no file format can carry: nothing can be written
            return Finding.failed(str(exc), evidence=NcclEvidence())
        return Finding.drift(
            "; ".join(problems),
            cause="NCCL ignores unknown names silently and fails at init on bad ALGO/PROTO tokens",
            repair=f"gpubox tune nccl {opts.box}",
            plan=plan,
            evidence=ev,
        )


def _write_plan(prof: Profile, files: dict[str, str], have: dict[str, str | None]) -> Plan:
    """Each file rendered from the profile, written where it differs."""
    writes = []
    for path, fmt in files.items():
        new = render(prof.env, fmt, header=file_header(prof, path))
        old = have.get(path) or ""
        if old != new:
            writes.append(Write(path, new, old=old, mode=0o644))
    return Plan(f"write profile {prof.name} to {', '.join(w.path for w in writes)}", actions=writes)
