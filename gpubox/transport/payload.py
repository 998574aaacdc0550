"""The one way gpubox runs its own code on a box: a zipped package run with the box's python3.

Like Ansible's AnsiballZ (a module and the module_utils it imports, zipped and run by the remote
python), the payload of an entry module is the zip of exactly the gpubox modules it needs: the
entry, every gpubox module it imports (followed through the source, imports inside functions
too, so the lazy ones travel), and the packages above them. Nothing else of gpubox travels, and
no third-party code: what a module imports from outside gpubox must be on the box (the modules
guard the optional ones: xxhash, rich, pynvml, torch). The simulator (gpubox.simbox) never
travels: building a payload that would need it is refused.

How it runs, for every transport alike (local, SSH, `pct exec`), an argv list, no shell:

    PYTHON -c BOOT ENTRY DIGEST ARGS...     stdin: the loader, the zip, then the entry's own input

BOOT is one fixed line that reads the loader (payload_loader.py, stdlib-only) from stdin and runs
it; the loader reads the zip, checks it against DIGEST, serves its modules from memory and runs
ENTRY as `__main__` (as `python3 -m ENTRY ARGS` would). Why stdin and memory, not a temporary
file on the box: nothing is written there, so a killed run leaves nothing to clean, and stdin
after the zip stays the entry's (the benchmark reads its request there). Stdout, stderr and the
exit status are the entry's, and stderr lines reach `on_stderr` live, as for any command.

The zip is deterministic (sorted members, fixed dates), so a dry run shows the digest that apply
ships. `python3 -m gpubox.transport.payload` prints each entry's modules and size.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import io
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..errors import GpuboxError

# The fixed first stage: drops the working directory (and any relative entry) from sys.path before
# anything else is imported, so a `json.py` in the container's cwd is never run; then reads the
# loader's length and source from stdin and runs it. `python -c` puts '' (the cwd) first on
# sys.path; -I would drop it too but also PYTHONPATH and the user site a container's libraries may
# live in, and -P needs python 3.11.
BOOT = (
    "import sys;sys.path[:]=[p for p in sys.path if p[:1]=='/'];_i=sys.stdin.buffer;"
    "exec(compile(_i.read(int(_i.readline())),'gpubox-payload','exec'))"
)
# The oldest python the payloads run on: the loader checks it first, before the entry runs (and
# so before a copier has copied anything), and `check_python` asks in one short call.
MIN_PYTHON = (3, 9)
CHECK_TIMEOUT = 30  # seconds for the cheap version call: a silent interpreter is found in these
# The entry's stdout is framed by these (with a nonce per run): what an interpreter prints before
# the entry starts or at its exit (atexit, a .pth, sitecustomize) is not the answer.
BEGIN, END = "<<gpubox-payload-begin %s>>", "<<gpubox-payload-end %s>>"
LOADER = Path(__file__).with_name("payload_loader.py")
SIMULATOR = "gpubox.simbox"
# Never shipped and not followed: this runner is the control side's (a module that runs payloads
# imports it in the function that does, never on the box).
CONTROL_ONLY = frozenset({"gpubox.transport.payload"})
# Every entry gpubox runs on a box (the layer test checks each payload; `python3 -m` lists them).
ENTRIES = (
    "gpubox.provision.cuda_probe",  # the CUDA probe (lxc cuda step)
    "gpubox.hwtune.nvml_probe",  # the NVML topology probe
    "gpubox.hwtune.probe",  # the GPU health probe (gpu-probe step)
    "gpubox.provision.stage.__main__",  # the model copier (model-stage, drafter-stage)
    "gpubox.provision.hf_snapshot",  # a repo id's Hugging Face cache snapshot
    "gpubox.bench.remote",  # the benchmark's container side
)
_DATE = (1980, 1, 1, 0, 0, 0)  # zip's earliest date: the same bytes every build


@dataclass(frozen=True)
class Payload:
    entry: str
    modules: tuple[str, ...]  # every module in the zip, sorted
    zip: bytes
    digest: str  # sha256 of the zip, hex

    @property
    def short(self) -> str:
        return self.digest[:16]

    def argv(self, python: str = "python3", args: Sequence[str] = (), flags: Sequence[str] = ()) -> list[str]:
        return [str(python), *flags, "-c", BOOT, self.entry, self.short, *map(str, args)]

    def stdin(self, input: bytes | str | None = None, nonce: str = "-") -> bytes:
        loader = _loader()
        rest = input.encode() if isinstance(input, str) else (input or b"")
        head = ("%s %d.%d" % (nonce, *MIN_PYTHON)).encode()
        return b"%d\n%s%s\n%d\n%s%s" % (len(loader), loader, head, len(self.zip), self.zip, rest)

    def describe(self) -> str:
        """One line for a dry run or a log: what travels on stdin with the argv."""
        return (
            f"payload {self.entry} on stdin: {len(self.modules)} modules, {len(self.zip)} bytes zipped, "
            f"sha256 {self.short}: {', '.join(self.modules)}"
        )


@functools.lru_cache(maxsize=1)
def _loader() -> bytes:
    """The far end's loader source (read once: it does not change while gpubox runs)."""
    return LOADER.read_bytes()


def unpack(stream: bytes) -> tuple[dict[str, bytes], bytes]:
    """What a payload's stdin carries: its zip's members by module name, and the entry's own
    input after it (for the simulated box's python3, which answers for one entry)."""
    n, _, rest = stream.partition(b"\n")
    rest = rest[int(n) :]
    _head, _, rest = rest.partition(b"\n")  # nonce and minimum python
    n, _, rest = rest.partition(b"\n")
    data, rest = rest[: int(n)], rest[int(n) :]
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        files = {
            a[: -len(".py")].replace("/", ".").removesuffix(".__init__"): z.read(a) for a in z.namelist()
        }
    return files, rest


def run(
    host,
    entry: str,
    args: Sequence[str] = (),
    *,
    python: str = "python3",
    input: bytes | str | None = None,
    timeout: float = 60,
    on_stderr=None,
    idle: float | None = None,
    flags: Sequence[str] = (),
):
    """Run ENTRY's payload with the python3 of HOST (a gpubox Host or a Transport); its CmdResult,
    whose stdout is what the entry printed (between the run's markers) and nothing else."""
    import secrets

    p = build(entry)
    nonce = secrets.token_hex(8)
    kw = {"on_stderr": on_stderr} if on_stderr is not None else {}
    if idle is not None:
        kw["idle"] = idle  # Transport.run: silence on stderr bounded too
    r = host.run(p.argv(python, args, flags), input=p.stdin(input, nonce), timeout=timeout, **kw)
    r.stdout = framed(r.stdout, nonce)
    return r


def framed(stdout: str, nonce: str) -> str:
    """The entry's own output in STDOUT: after the begin marker, before the end marker. Without
    the begin marker the entry never ran (the loader refused, python failed): STDOUT as it is.
    Without the end marker the entry ended the process itself (os._exit, a signal): all after
    the begin marker."""
    begin, end = BEGIN % nonce + "\n", "\n" + END % nonce + "\n"
    i = (stdout or "").find(begin)
    if i < 0:
        return stdout
    body = stdout[i + len(begin) :]
    j = body.rfind(end)
    return body if j < 0 else body[:j]


def check_python(host, python: str = "python3", timeout: float = CHECK_TIMEOUT) -> str:
    """One cheap call before a long payload run: PYTHON answers within TIMEOUT and is new enough.
    Its version ("3.11"), or GpuboxError naming the interpreter and the fix. A run of hours (a
    model copy, a benchmark) is started only on an interpreter that answered."""
    code = "import sys;sys.stdout.write('%d.%d' % sys.version_info[:2])"
    where = getattr(host, "name", "the box")
    try:
        r = host.run([str(python), "-I", "-c", code], timeout=timeout)
    except GpuboxError as exc:
        raise GpuboxError(
            f"{where}: `{python}` did not answer a version check within {timeout:g} s ({exc.problem})",
            "check the interpreter there (gpubox_python), or what makes it hang at start",
        ) from None
    if r.rc == 127:
        raise GpuboxError(f"{where}: `{python}` is not there", "install python3 there, or set gpubox_python")
    text = (r.stdout or "").strip()
    try:
        have = tuple(int(x) for x in text.split("."))
    except ValueError:
        have = ()
    if r.rc != 0 or len(have) != 2:
        tail = ((r.stderr or "").strip().splitlines() or [f"exit {r.rc}"])[-1]
        raise GpuboxError(
            f"{where}: `{python}` did not give its version: {tail}", "check the interpreter there"
        )
    if have < MIN_PYTHON:
        raise GpuboxError(
            f"{where}: `{python}` is python {text}; gpubox's box-side code needs >= {'%d.%d' % MIN_PYTHON}",
            "install a newer python3 there, or set gpubox_python to one",
        )
    return text


@functools.lru_cache(maxsize=None)
def build(entry: str) -> Payload:
    """ENTRY's payload (cached: the sources do not change while gpubox runs)."""
    files = modules_of(entry)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        for name in sorted(files):
            path, is_pkg = files[name]
            arc = name.replace(".", "/") + ("/__init__.py" if is_pkg else ".py")
            info = zipfile.ZipInfo(arc, _DATE)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            z.writestr(info, Path(path).read_bytes())
    data = buf.getvalue()
    return Payload(entry, tuple(sorted(files)), data, hashlib.sha256(data).hexdigest())


def modules_of(entry: str) -> dict[str, tuple[str, bool]]:
    """name -> (file, is package) for ENTRY and every gpubox module it needs (see the docstring).

    A package only passed through (the parent of a needed module) brings the imports its
    `__init__` runs at load time; one imported by name brings all of them, like any module."""
    found: dict[str, tuple[str, bool]] = {}
    full: set[str] = set()  # modules whose every import was followed
    todo = [(entry, True)]
    while todo:
        name, whole = todo.pop()
        if name in CONTROL_ONLY or (name in full) or (name in found and not whole):
            continue
        loc = _locate(name)
        if loc is None:
            raise GpuboxError(
                f"payload {entry}: no module {name}", "a gpubox module imports what is not there"
            )
        found[name] = loc
        if whole:
            full.add(name)
        parent = name.rpartition(".")[0]
        if parent:
            todo.append((parent, False))
        for dep in _imports(name, *loc, in_functions=whole):
            todo.append((dep, True))
    return found


def _locate(name: str) -> tuple[str, bool] | None:
    if name == SIMULATOR or name.startswith(SIMULATOR + "."):
        raise GpuboxError(
            f"a payload would ship the simulator ({name})", "nothing simulated goes to a box: fix the import"
        )
    if "." in name:
        parent = _locate(name.rpartition(".")[0])
        if parent is None or not parent[1]:
            return None  # an attribute of a module, not a module
    try:
        spec = importlib.util.find_spec(name)  # imports the parent packages only (checked above)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    return spec.origin, spec.submodule_search_locations is not None


def _imports(module: str, path: str, is_pkg: bool, in_functions: bool) -> list[str]:
    """The gpubox modules MODULE's import statements name (a `from X import y` counts as X.y when
    that is a module, else as X)."""
    import ast

    out: list[str] = []
    todo: list[ast.AST] = [ast.parse(Path(path).read_bytes(), path)]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names if _ours(a.name)]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = module.split(".") if is_pkg else module.split(".")[:-1]
                pkg = pkg[: len(pkg) - (node.level - 1)]
                base = ".".join(pkg + ([node.module] if node.module else []))
            if _ours(base):
                subs = [f"{base}.{a.name}" for a in node.names if a.name != "*"]
                mods = [s for s in subs if _is_module(s)]
                out += mods if len(mods) == len(subs) else [*mods, base]
        if not in_functions and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        todo.extend(ast.iter_child_nodes(node))
    return out


def _ours(name: str) -> bool:
    return name == "gpubox" or name.startswith("gpubox.")


def _is_module(name: str) -> bool:
    try:
        return _locate(name) is not None
    except GpuboxError:
        return True  # the simulator: let modules_of refuse it by name


def main() -> int:
    """`python3 -m gpubox.transport.payload`: each entry, its module count and sizes."""
    print(f"{'entry':32} {'modules':>7} {'source B':>9} {'zip B':>7} {'stdin B':>8}")
    for entry in ENTRIES:
        p = build(entry)
        src = sum(Path(f).stat().st_size for f, _ in modules_of(entry).values())
        print(f"{entry:32} {len(p.modules):7} {src:9} {len(p.zip):7} {len(p.stdin()):8}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
