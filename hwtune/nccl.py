"""NCCL environment profiles: validated data, exported in the formats consumers read.

One module (about 680 lines): the variable table, validation, profiles and the export formats share
one quoting and parsing contract (what is written must parse back as written).

Facts (docs/facts.md "NCCL environment"): NCCL never warns about unknown or misspelled NCCL_* names,
treats a bad NCCL_P2P_LEVEL string as unset, and fails at init on a bad NCCL_ALGO/NCCL_PROTO
token. So every name is checked against the documented table (nccl_vars.yaml, built from NCCL's
env.rst) with a did-you-mean, every value against its type, and debug-class or deprecated names
(MIN/MAX_NCHANNELS -> MIN/MAX_CTAS) give warnings.

Formats and the rules of their readers:
- shell:   `export K=V` and
- envfile: systemd EnvironmentFile= (also `set -a; . FILE`): one quoting rule, quote(), whose three
           forms bash and systemd read to the same literal; `nccl check` flags any other form.
- docker:  `docker run --env-file`: `K=V` taken literally, no quoting at all.
- ncclconf: /etc/nccl.conf or $NCCL_CONF_FILE: NCCL's setEnvFile (src/misc/param.cc) skips lines
           starting with '#', splits at the first '=', and takes both sides literally (no trimming).
- json:    {"NCCL_X": "value"}.

The nccl-env step (hwtune/nccl_env_step.py) decides over the facts defined at the end of this module:
the container's NCCL files and the topology class NVML sees in the container.
"""

from __future__ import annotations

import functools
import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from gpubox.errors import GpuboxError
from gpubox.facts import Fact
from gpubox.readlimit import read_regular
from gpubox.suggest import close

HERE = Path(__file__).resolve().parent
PROFILE_DIR = HERE / "profiles"
USER_PROFILE_DIR = Path("~/.config/gpubox/nccl-profiles").expanduser()
PROFILES_ENV = "GPUBOX_NCCL_PROFILES"  # extra profile directories, ':'-separated
FORMATS = ("shell", "envfile", "docker", "ncclconf", "json")
ALGOS = ["Ring", "Tree", "CollnetDirect", "CollnetChain", "NVLS", "NVLSTree", "PAT"]
PROTOS = ["LL", "LL128", "Simple"]
FUNCS = ["Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllReduce"]  # src/init.cc ncclFuncStr
NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# The one quoting rule (shell and envfile): a value is written bare only when it consists of these
# characters, none of which bash or systemd give a meaning (no | & ; < > ( ) $ ` \\ " ' space * ? [ ~ # !).
SAFE_VALUE = re.compile(r"^[A-Za-z0-9_.,:/@%+=^-]*$")
CONTROL = re.compile(r"[\x00-\x1f\x7f]")


# -- the documented table ----------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def table() -> dict[str, Any]:
    """The documented variables, shipped with gpubox: read with LibYAML's safe loader where PyYAML
    has it (the same YAML, a tenth of the pure-Python parser's 60 ms, paid by every step list)."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load((HERE / "nccl_vars.yaml").read_text(), Loader=loader)  # noqa: S506 - a safe loader


def documented() -> dict[str, dict]:
    return table()["variables"]


def known_names() -> list[str]:
    t = table()
    return [*t["variables"], *t["aliases"], *t["undocumented"]]


@dataclass
class Issue:
    level: str  # error | warning
    name: str
    message: str
    suggestion: str | None = None

    def __str__(self) -> str:
        return f"{self.name}: {self.message}" + (
            f" (did you mean {self.suggestion}?)" if self.suggestion else ""
        )


def did_you_mean(word: str, choices: list[str], cutoff: float = 0.7) -> str | None:
    m = close(word, choices, n=1, cutoff=cutoff)
    return m[0] if m else None


def suggest_name(name: str) -> str | None:
    """Closest known NCCL_ name, compared without the common NCCL_ prefix (which would make every
    name look alike)."""
    tails = {n[5:]: n for n in known_names()}
    hit = did_you_mean(name.removeprefix("NCCL_"), list(tails), 0.75)
    return tails[hit] if hit else None


def _int(text: str) -> int | None:
    """NCCL reads integers with strtoll(str, NULL, 0): decimal, 0x hex, leading 0 octal."""
    try:
        return int(text, 0) if not re.fullmatch(r"[+-]?0\d+", text) else int(text, 8)
    except ValueError:
        return None


def _token_list(name: str, value: str, choices: list[str], what: str) -> list[Issue]:
    """NCCL_ALGO / NCCL_PROTO: `[func:][^]a,b;func:[^]c` (2.24+), tokens case-insensitive."""
    issues = []
    if not value.strip():
        return [Issue("error", name, f"empty {what} list")]
    for seg in value.split(";"):
        body = seg
        if ":" in seg:
            func, body = seg.split(":", 1)
            if func.strip().lower() not in [f.lower() for f in FUNCS]:
                issues.append(
                    Issue(
                        "error",
                        name,
                        f"unknown collective {func.strip()!r} in {value!r}",
                        did_you_mean(func.strip(), FUNCS),
                    )
                )
        body = body.strip().removeprefix("^")
        for tok in body.split(","):
            t = tok.strip()
            if t.lower() == "collnet" and what == "algorithm":
                issues.append(
                    Issue("warning", name, "'Collnet' was accepted only by NCCL 2.5-2.13", "CollnetDirect")
                )
                continue
            if t.lower() not in [c.lower() for c in choices]:
                issues.append(
                    Issue(
                        "error",
                        name,
                        f"unknown {what} {t!r} in {value!r}; NCCL fails at init on it",
                        did_you_mean(t, choices, 0.5),
                    )
                )
    return issues


def check_value(name: str, value: str, spec: dict) -> list[Issue]:
    """Problems with one value against its documented type."""
    t, v = spec["type"], str(value)
    if t == "bool":
        return (
            []
            if v.strip() in ("0", "1")
            else [Issue("error", name, f"{v!r} is not 0 or 1 (NCCL parses an integer)")]
        )
    if t == "int":
        n = _int(v.strip())
        if n is None:
            return [Issue("error", name, f"{v!r} is not an integer")]
        if "choices" in spec and n not in spec["choices"]:
            return [Issue("error", name, f"{n} is not one of {', '.join(map(str, spec['choices']))}")]
        if "min" in spec and n < spec["min"] or "max" in spec and n > spec["max"]:
            rng = f"{spec.get('min', '')}..{spec.get('max', '')}"
            return [Issue("error", name, f"{n} is outside {rng}")]
        return []
    if t == "enum":
        choices = spec["choices"]
        ok = v in choices or (spec.get("case_insensitive") and v.upper() in [c.upper() for c in choices])
        return (
            []
            if ok
            else [
                Issue(
                    "error", name, f"{v!r} is not one of {', '.join(choices)}", did_you_mean(v, choices, 0.5)
                )
            ]
        )
    if t == "list":
        if not v and spec.get("empty_ok"):
            return []
        out = []
        for tok in v.removeprefix("^").split(","):
            tok = tok.strip().removeprefix("^")
            if tok.upper() not in spec["choices"]:
                out.append(
                    Issue("error", name, f"unknown entry {tok!r}", did_you_mean(tok, spec["choices"], 0.5))
                )
        return out
    if t == "path_level":
        if v.strip().upper() in spec["choices"]:
            return []
        n = _int(v.strip())
        if n is not None and n >= 0:
            return [
                Issue(
                    "warning",
                    name,
                    f"legacy integer level {n}: the docs discourage it, use {'/'.join(spec['choices'])}",
                )
            ]
        # docs/facts.md "NCCL environment": a bad NCCL_P2P_LEVEL string is silently treated as unset.
        return [
            Issue(
                "error",
                name,
                f"{v!r} is not one of {', '.join(spec['choices'])}; NCCL would silently ignore it",
                did_you_mean(v, spec["choices"], 0.5),
            )
        ]
    if t == "algo":
        return _token_list(name, v, ALGOS, "algorithm")
    if t == "proto":
        return _token_list(name, v, PROTOS, "protocol")
    if t == "cta_policy":
        if v.strip() in ("0", "1", "2"):
            return []
        bad = [p for p in v.split("|") if p.strip().upper() not in ("DEFAULT", "EFFICIENCY", "ZERO")]
        return [
            Issue(
                "error",
                name,
                f"unknown policy {p.strip()!r}",
                did_you_mean(p.strip(), ["DEFAULT", "EFFICIENCY", "ZERO"], 0.5),
            )
            for p in bad
        ]
    if t == "netdevs_policy":
        ok = v.upper() in ("AUTO", "ALL") or re.fullmatch(r"(?i)MAX:[1-9]\d*", v)
        return [] if ok else [Issue("error", name, f"{v!r} is not AUTO, ALL or MAX:N")]
    if t in ("str", "path"):
        return [] if v.strip() else [Issue("warning", name, "empty value")]
    return []


def validate(env: Mapping[str, Any], *, only_nccl: bool = False) -> list[Issue]:
    """Every problem in an NCCL environment: unknown names (did-you-mean), bad values, debug-class
    and deprecated names. Non-NCCL_ names are ignored when only_nccl, else an error."""
    tab = table()
    docs, aliases, undoc = tab["variables"], tab["aliases"], set(tab["undocumented"])
    issues: list[Issue] = []
    for raw, value in env.items():
        name = str(raw)
        value = "" if value is None else str(value)
        if name != name.strip() or not NAME_RE.match(name.strip()):
            issues.append(
                Issue(
                    "error",
                    name,
                    "is not a valid variable name (spaces around '='? NCCL's conf "
                    "reader and docker take the line literally)",
                    name.strip() or None,
                )
            )
            continue
        if not name.startswith("NCCL_"):
            if not only_nccl:
                issues.append(Issue("error", name, "is not an NCCL_ variable"))
            continue
        if "\n" in value or "\x00" in value:
            issues.append(Issue("error", name, "value contains a newline or NUL"))
            continue
        spec_name = name
        if name in aliases:
            target = aliases[name]
            issues.append(
                Issue(
                    "warning",
                    name,
                    f"old alias of {target} (ignored when {target} is set); "
                    f"write {docs[target].get('deprecated', {}).get('use', target)}",
                )
            )
            spec_name = target
        elif name in undoc:
            issues.append(
                Issue(
                    "warning",
                    name,
                    "is read by NCCL's source but not documented in env.rst: "
                    "it may change or vanish between releases",
                )
            )
            continue
        elif name not in docs:
            issues.append(
                Issue("error", name, "is not an NCCL variable; NCCL ignores it silently", suggest_name(name))
            )
            continue
        spec = docs[spec_name]
        issues.extend(check_value(name, value, spec))
        dep = spec.get("deprecated")
        if dep:
            use = dep.get("use")
            issues.append(
                Issue(
                    "warning", name, f"deprecated since NCCL {dep['since']}" + (f"; use {use}" if use else "")
                )
            )
        if spec["class"] == "debug":
            issues.append(
                Issue(
                    "warning",
                    name,
                    "is a debugging knob (env.rst 'Debugging'): keep it only where "
                    "a measurement on this box justifies it",
                )
            )
    return issues


def errors(issues: list[Issue]) -> list[Issue]:
    return [i for i in issues if i.level == "error"]


# -- profiles ----------------------------------------------------------------------------------
@dataclass
class Profile:
    name: str
    description: str
    env: dict[str, str]
    path: str
    notes: str = ""
    issues: list[Issue] = field(default_factory=list)
    topologies: list[str] = field(default_factory=list)  # hwtune.links classes it is for (issue 18)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["issues"] = [asdict(i) for i in self.issues]
        return d


def profile_dirs() -> list[Path]:
    extra = [Path(p).expanduser() for p in os.environ.get(PROFILES_ENV, "").split(":") if p]
    return [*extra, USER_PROFILE_DIR, PROFILE_DIR]


def _load_profile_file(path: Path) -> Profile:
    try:
        doc = yaml.safe_load(read_regular(path, 4 << 20, what="NCCL profile").decode())
    except yaml.YAMLError as exc:
        raise GpuboxError(
            f"profile {path} is not valid YAML: {str(exc).splitlines()[0]}", "fix its syntax"
        ) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("env", {}), dict):
        raise GpuboxError(
            f"profile {path} must be a mapping with an `env:` mapping", "see hwtune/profiles/*.yaml"
        )
    env = {str(k): _scalar(v) for k, v in (doc.get("env") or {}).items()}
    p = Profile(
        str(doc.get("name") or path.stem),
        str(doc.get("description", "")).strip(),
        env,
        str(path),
        str(doc.get("notes", "")).strip(),
    )
    p.issues = validate(env)
    p.topologies = [str(t) for t in (doc.get("topologies") or [])]
    return p


def _scalar(v) -> str:
    if isinstance(v, bool):  # YAML `yes`/`true`: NCCL wants 0/1
        return "1" if v else "0"
    return str(v)


def list_profiles() -> dict[str, Profile]:
    """name -> profile; an earlier directory (user, $GPUBOX_NCCL_PROFILES) hides a shipped one."""
    out: dict[str, Profile] = {}
    for d in reversed(profile_dirs()):
        if d.is_dir():
            for f in sorted(d.glob("*.y*ml")):
                p = _load_profile_file(f)
                out[p.name] = p
    return out


def load_profile(name_or_path: str, *, strict: bool = True) -> Profile:
    """A profile by name or by file path; with strict, validation errors are bad input (exit 2)."""
    path = Path(name_or_path).expanduser()
    if name_or_path.endswith((".yml", ".yaml")) or path.is_file():
        if not path.is_file():
            raise GpuboxError(
                f"profile file {path} does not exist", "give an existing YAML file or a profile name"
            )
        p = _load_profile_file(path)
    else:
        profiles = list_profiles()
        if name_or_path not in profiles:
            hint = did_you_mean(name_or_path, list(profiles), 0.5)
            raise GpuboxError(
                f"unknown NCCL profile {name_or_path!r}" + (f" (did you mean {hint}?)" if hint else ""),
                f"known: {', '.join(sorted(profiles))}; `gpubox nccl profiles` lists them",
            )
        p = profiles[name_or_path]
    if strict and errors(p.issues):
        raise GpuboxError(
            f"profile {p.name} ({p.path}) is invalid: " + "; ".join(map(str, errors(p.issues))),
            "fix the profile's env entries",
        )
    return p


# -- export ------------------------------------------------------------------------------------
def quote(v: str) -> str:
    """The one quoting rule for `source`-able files (shell and envfile): bare when SAFE_VALUE,
    else '...' when there is no single quote, else "..." with \\ " ` $ escaped. bash and systemd's
    EnvironmentFile parser (env-file.c) read all three forms to the same literal value, and no
    form leaves a character that bash would run, expand or split on. A value that starts with `=`
    (NCCL's exact-match prefix, NCCL_IB_HCA==mlx5_0) is quoted too: bash reads `K==v` right, but it
    looks like a typo to people and to shellcheck (SC1097)."""
    if SAFE_VALUE.match(v) and not v.startswith("="):
        return v
    if "'" not in v:
        return f"'{v}'"
    return '"' + re.sub(r'(["\\`$])', r"\\\1", v) + '"'


_envfile_value = quote


def refuse_unexportable(k: str, v: str, fmt: str) -> None:
    """What no format can carry: a bad name, control characters (a newline would start a new
    assignment in every line-based reader), or edge whitespace where the reader keeps it."""
    if not NAME_RE.match(k):
        raise GpuboxError(f"cannot export {k!r}: not a variable name", "fix the profile")
    if CONTROL.search(v):
        raise GpuboxError(
            f"cannot export {k}: value contains a control character (newline, NUL, ESC...)", "fix the profile"
        )
    if fmt in ("docker", "ncclconf") and v != v.strip():
        raise GpuboxError(
            f"cannot export {k} as {fmt}: leading/trailing whitespace would be kept literally",
            "trim the value",
        )


def render(env: Mapping[str, str], fmt: str, *, header: str | None = None) -> str:
    """The env in one export format; refuses what the format cannot carry."""
    if fmt not in FORMATS:
        raise GpuboxError(f"unknown export format {fmt!r}", f"use one of {', '.join(FORMATS)}")
    for k, v in env.items():
        refuse_unexportable(k, str(v), fmt)
    if fmt == "json":
        return json.dumps(dict(env), indent=2) + "\n"
    lines = [f"# {' '.join(line.split())}" for line in (header or "").splitlines()]
    for k, v in env.items():
        if fmt == "shell":
            lines.append(f"export {k}={quote(v)}")
        elif fmt == "envfile":
            lines.append(f"{k}={quote(v)}")
        else:  # docker, ncclconf: literal
            lines.append(f"{k}={v}")
    return "\n".join(lines) + "\n"


_DQ_BODY = re.compile(r'(?:[^"\\`$]|\\.)*')


def unsafe_lines(text: str) -> list[tuple[int, str]]:
    """Lines of a shell/envfile export that `set -a; . FILE` would not read as a plain literal
    assignment (a pipe, command substitution, expansion, a second command...): (line number, line).
    Both readers agree only on what the one quoting rule writes, so anything else is flagged."""
    bad = []
    for no, line in enumerate(text.split("\n"), 1):
        s = line.strip()
        if not s or s.startswith(("#", ";")):
            continue
        m = re.fullmatch(r"(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)", s)
        if not m:
            bad.append((no, line))
            continue
        v = m.group(2)
        if (
            SAFE_VALUE.fullmatch(v)
            or re.fullmatch(r"'[^']*'", v)
            or (len(v) >= 2 and v[0] == v[-1] == '"' and _DQ_BODY.fullmatch(v[1:-1]))
        ):
            continue
        bad.append((no, line))
    return bad


# -- parse (what each consumer would read) -----------------------------------------------------
def parse_ncclconf(text: str) -> dict[str, str]:
    """Exactly NCCL's setEnvFile: '#' in column 0 skips, no '=' skips, split at the first '='."""
    out = {}
    for line in text.split("\n"):
        line = line.removesuffix("\r")
        if not line or line.startswith("#") or "=" not in line:
            continue
        k, v = line.split("=", 1)
        out[k] = v
    return out


def parse_docker(text: str) -> dict[str, str]:
    """docker --env-file: '#' comments and blank lines skipped, K=V literal, leading spaces of the
    line trimmed, a bare `K` copies the caller's environment (reported as missing here)."""
    out = {}
    for line in text.splitlines():
        s = line.lstrip()
        if not s or s.startswith("#"):
            continue
        if "=" in s:
            k, v = s.split("=", 1)
            out[k] = v
        else:
            out[s] = os.environ.get(s, "")
    return out


def parse_envfile(text: str) -> dict[str, str]:
    """systemd EnvironmentFile= rules (systemd.exec(5), env-file.c): '#'/';' comment lines, K=V with
    leading/trailing whitespace of unquoted values dropped, '...' verbatim, "..." with backslash
    escapes of " \\ ` $, backslash-newline continues a line. Invalid names are skipped as systemd does."""
    out: dict[str, str] = {}
    i, n = 0, len(text)
    while i < n:
        while i < n and text[i] in " \t\r\n":
            i += 1
        if i >= n:
            break
        if text[i] in "#;":
            while i < n and text[i] != "\n":
                i += 1
            continue
        j = i
        while j < n and text[j] not in "=\n":
            j += 1
        key = text[i:j].strip()
        if j >= n or text[j] == "\n":
            i = j
            continue
        i = j + 1
        while i < n and text[i] in " \t":
            i += 1
        val = []
        if i < n and text[i] == "'":
            end = text.find("'", i + 1)
            if end < 0:
                raise GpuboxError(f"EnvironmentFile: unterminated ' for {key}", "close the quote")
            val.append(text[i + 1 : end])
            i = end + 1
        elif i < n and text[i] == '"':
            i += 1
            while i < n and text[i] != '"':
                if text[i] == "\\" and i + 1 < n:
                    nxt = text[i + 1]
                    if nxt == "\n":
                        i += 2
                        continue
                    val.append(nxt if nxt in '"\\`$' else "\\" + nxt)
                    i += 2
                    continue
                val.append(text[i])
                i += 1
            if i >= n:
                raise GpuboxError(f'EnvironmentFile: unterminated " for {key}', "close the quote")
            i += 1
        else:
            while i < n and text[i] != "\n":
                if text[i] == "\\" and i + 1 < n:
                    if text[i + 1] != "\n":
                        val.append(text[i + 1])
                    i += 2
                    continue
                val.append(text[i])
                i += 1
            val = ["".join(val).rstrip(" \t\r")]
        while i < n and text[i] != "\n":  # rest of a quoted line
            i += 1
        if NAME_RE.match(key):
            out[key] = "".join(val)
    return out


def parse_shell(text: str) -> dict[str, str]:
    """`export K=V` / `K=V` lines as bash assigns the three forms quote() writes ('...', "..." with
    \\ " ` $ escapes, bare): the same value reader as the envfile once `export ` is dropped (shlex
    does not unescape `\\$` inside double quotes as bash does). Other forms: see unsafe_lines()."""
    return parse_envfile(re.sub(r"(?m)^([ \t]*)export[ \t]+", r"\1", text))


def detect_format(text: str, path: str = "") -> str:
    s = text.lstrip()
    if s.startswith("{"):
        return "json"
    if path.endswith("nccl.conf"):
        return "ncclconf"
    if re.search(r"^\s*export\s", text, re.M):
        return "shell"
    return "envfile"


def parse(text: str, fmt: str) -> dict[str, str]:
    if fmt == "json":
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise GpuboxError(f"JSON: {exc}", "fix the file") from None
        if not isinstance(doc, dict):
            raise GpuboxError("JSON: expected an object of NAME: value", "fix the file")
        return {str(k): _scalar(v) for k, v in doc.items()}
    return {
        "shell": parse_shell,
        "envfile": parse_envfile,
        "docker": parse_docker,
        "ncclconf": parse_ncclconf,
    }[fmt](text)


# -- the box's files and facts ------------------------------------------------------------------
ENV_FILE = "/etc/gpubox/nccl.env"  # EnvironmentFile= of the server's unit (and `source`-able)
CONF_FILE = "/etc/nccl.conf"  # NCCL's own system-wide file, for processes started otherwise


def box_files(ctx) -> dict[str, str]:
    """path -> format of the files the server reads its NCCL environment from."""
    return {str(ctx.box.var("gpubox_nccl_env_file", ENV_FILE)): "envfile", CONF_FILE: "ncclconf"}


OWNED_MARK = "Managed by gpubox: NCCL profile"


def file_header(p: Profile, path: str) -> str:
    return (
        f"{OWNED_MARK} {p.name} ({'EnvironmentFile' if path != CONF_FILE else 'nccl.conf'}).\n"
        "Edits are replaced by `gpubox tune nccl`; change the profile instead."
    )


def owned_by(profile_name: str, text: str | None) -> bool:
    """A file gpubox wrote for this profile: its first line is the header file_header() writes."""
    return text is not None and text.startswith(f"# {OWNED_MARK} {profile_name} (")


class ContainerFile(Fact):
    """A file's text in the container; None when it does not exist."""

    where = "container"

    @staticmethod
    def read(host, path: str) -> str:
        return host.read_text(path, default="\0")

    @staticmethod
    def parse(raw: str, path: str = "") -> str | None:
        return None if raw == "\0" else raw


class NvmlTopologyClass(Fact):
    """The topology class (hwtune.links) NVML sees in the container, None when NVML is not there.
    Read through the container only: nccl-env runs in the container's lane, and reading the host
    from there would share the host's transport with the host lane's steps. A simulated box
    (`simulated`) has no GPU for NVML to find: nothing is run."""

    where = "container"

    @staticmethod
    def read(host, simulated: bool = False) -> dict | None:
        if simulated:
            return None
        from .topology import probe_nvml

        try:
            return probe_nvml(host)
        except GpuboxError:
            return None

    @staticmethod
    def parse(raw: dict | None, simulated: bool = False) -> str | None:
        if not raw:
            return None
        from .links import classify_topology
        from .topology import from_nvml_doc

        return str(classify_topology(from_nvml_doc(raw)))


def pick_from(profiles: list[Profile], topology_class: str | None) -> Profile | None:
    """The one profile written for this topology class (not `any`); none, or more than one, ->
    None: NCCL's own tuning, never a forced protocol."""
    fits = [p for p in profiles if topology_class in p.topologies]
    return fits[0] if len(fits) == 1 else None


def pick_profile(topology_class: str) -> Profile | None:
    """`gpubox_nccl_profile: auto`: pick_from every known profile."""
    return pick_from(list(list_profiles().values()), topology_class)
