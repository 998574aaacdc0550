"""Hub-less integrity checks of a model directory (stdlib only: travels with the copier, provision/stage/).

What a server needs to load a model, checked without the hub and without reading the weights:
- every shard named in `model.safetensors.index.json` exists, and holds the tensors the index
  maps to it;
- every `.safetensors` file parses: an 8-byte little-endian header length, then that many bytes of
  JSON; each tensor's `data_offsets` lie inside the data area, match dtype x shape, and the file
  size equals 8 + header length + the largest data end (a truncated copy fails this);
- every `.gguf` file starts with the GGUF magic and a defined version (1..3, little-endian uint32);
- config.json (and, for a main model, a tokenizer) is present, unless the model is a single file:
  a directory whose weights are one `.gguf` or one `.safetensors` at its top, with no config.json
  and no index (a GGUF or single-checkpoint layout that llama.cpp and vLLM serve by the file's
  path); then that file's header is its completeness check.
Where a file comes from a Hugging Face cache (`snapshots/<rev>/<name>` symlinked to
`blobs/<sha256>`), the blob's name is the hub's sha256 of an LFS file: `hub_sha256()` returns it so the
copier can check it while copying.
"""

from __future__ import annotations

import json
import os
import re
import struct

INDEX = "model.safetensors.index.json"
MAX_HEADER = 100 * 1000 * 1000  # the safetensors library refuses larger headers too
# Bytes per element; sub-byte float formats are skipped in the dtype x shape check.
DTYPE_BYTES = {
    "F64": 8,
    "I64": 8,
    "U64": 8,
    "F32": 4,
    "I32": 4,
    "U32": 4,
    "F16": 2,
    "BF16": 2,
    "I16": 2,
    "U16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "F8_E8M0": 1,
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tiktoken.model")
WEIGHTS = (".safetensors", ".gguf", ".bin", ".pt")
GGUF_MAGIC = b"GGUF"
GGUF_VERSIONS = (1, 2, 3)  # the versions ggml's GGUF specification (docs/gguf.md) defines; 3 is current
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class IntegrityError(Exception):
    """A file is not what a loader expects."""


def read_header(path: str) -> tuple[int, dict]:
    """(header length, header JSON) of a .safetensors file."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise IntegrityError(f"{os.path.basename(path)}: {len(head)} bytes, too short for a header")
        (n,) = struct.unpack("<Q", head)
        if n == 0 or n > MAX_HEADER:
            raise IntegrityError(f"{os.path.basename(path)}: header length {n} is not plausible")
        raw = f.read(n)
    if len(raw) < n:
        raise IntegrityError(f"{os.path.basename(path)}: header cut short ({len(raw)} of {n} bytes)")
    try:
        hdr = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise IntegrityError(f"{os.path.basename(path)}: header is not JSON ({exc})") from None
    if not isinstance(hdr, dict):
        raise IntegrityError(f"{os.path.basename(path)}: header is not a JSON object")
    return n, hdr


def check_shard(path: str) -> tuple[list[str], set[str]]:
    """Problems of one .safetensors file, and the tensor names it holds."""
    name = os.path.basename(path)
    try:
        n, hdr = read_header(path)
    except IntegrityError as exc:
        return [str(exc)], set()
    except OSError as exc:
        return [f"{name}: cannot read ({exc.strerror})"], set()
    data_len = os.path.getsize(path) - 8 - n
    end_max, problems, names = 0, [], set()
    for tname, t in hdr.items():
        if tname == "__metadata__":
            continue
        names.add(tname)
        try:
            begin, end = (int(x) for x in t["data_offsets"])
            shape = [int(x) for x in t["shape"]]
            dtype = str(t["dtype"])
        except (KeyError, TypeError, ValueError):
            problems.append(f"{name}: tensor {tname} has a malformed header entry")
            continue
        if not 0 <= begin <= end:
            problems.append(f"{name}: tensor {tname} has offsets {begin}..{end}")
            continue
        width = DTYPE_BYTES.get(dtype)
        if width is not None:
            count = 1
            for d in shape:
                count *= d
            if count * width != end - begin:
                problems.append(
                    f"{name}: tensor {tname} {dtype}{shape} needs {count * width} bytes, "
                    f"offsets give {end - begin}"
                )
        end_max = max(end_max, end)
    if data_len != end_max:
        how = "truncated" if data_len < end_max else "has trailing bytes"
        problems.append(f"{name}: {how}: file is {8 + n + data_len} bytes, header says {8 + n + end_max}")
    return problems, names


def check_gguf(path: str) -> list[str]:
    """Problems of one .gguf file's header: the magic `GGUF`, then the version as a little-endian
    uint32 (the first 8 bytes of the format; a reader checks them before it trusts the rest)."""
    name = os.path.basename(path)
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError as exc:
        return [f"{name}: cannot read ({exc.strerror})"]
    if len(head) < 8:
        return [f"{name}: {len(head)} bytes, too short for a GGUF header"]
    if head[:4] != GGUF_MAGIC:
        return [f"{name}: not a GGUF file (magic {head[:4]!r}, not {GGUF_MAGIC!r})"]
    (version,) = struct.unpack("<I", head[4:])
    if version not in GGUF_VERSIONS:
        return [f"{name}: GGUF version {version}, not one of {', '.join(map(str, GGUF_VERSIONS))}"]
    return []


def single_file_model(files) -> str | None:
    """The one weights file of a single-file model, else None: no config.json and no index, and the
    only weights are one `.gguf` or one `.safetensors` at the top of the directory. Such a model
    needs no config or tokenizer beside it (a GGUF holds its own; a lone checkpoint is served by its
    path), so its header check (check_gguf, check_shard) is what says it is complete."""
    if "config.json" in files or INDEX in files:
        return None
    weights = [r for r in files if r.endswith(WEIGHTS)]
    if len(weights) == 1 and weights[0].endswith((".gguf", ".safetensors")) and "/" not in weights[0]:
        return weights[0]
    return None


def check_model(root: str, files: dict | None = None, require_tokenizer: bool = True) -> list[str]:
    """Problems that would stop a server loading the model directory `root` (empty list = fine).

    `files` (relative names) saves a directory walk when the caller already has one."""
    if files is None:
        files = {}
        for dirpath, dirs, names in os.walk(root, followlinks=True):
            dirs[:] = [d for d in dirs if not d.startswith(".")]
            for f in names:
                files[os.path.relpath(os.path.join(dirpath, f), root)] = None
    problems: list[str] = []
    single = single_file_model(files) is not None
    if "config.json" not in files and not single:
        problems.append("config.json is missing")
    if require_tokenizer and not single and not any(t in files for t in TOKENIZER_FILES):
        problems.append(f"no tokenizer ({' / '.join(TOKENIZER_FILES)}) is present")
    held: dict[str, set[str]] = {}
    for rel in sorted(files):
        if rel.endswith(".safetensors"):
            p, names = check_shard(os.path.join(root, rel))
            problems += p
            held[rel] = names
        elif rel.endswith(".gguf"):
            problems += check_gguf(os.path.join(root, rel))
    if INDEX in files:
        try:
            with open(os.path.join(root, INDEX), "rb") as f:
                wmap = json.load(f)["weight_map"]
            if not isinstance(wmap, dict):
                raise TypeError
        except (OSError, ValueError, KeyError, TypeError):
            problems.append(f"{INDEX} has no readable weight_map")
            wmap = {}
        missing_shards = sorted({s for s in wmap.values() if s not in files})
        for s in missing_shards:
            problems.append(f"shard {s} named in {INDEX} is missing")
        absent = [t for t, s in wmap.items() if s in held and t not in held[s]]
        if absent:
            problems.append(f"{len(absent)} tensor(s) of {INDEX} are not in their shard, e.g. {absent[0]}")
    elif not held and not any(r.endswith((".bin", ".pt", ".gguf")) for r in files):
        problems.append("no weights (*.safetensors) are present")
    return problems


def hub_sha256(path: str) -> str | None:
    """The hub's sha256 of a file in a Hugging Face cache, else None.

    huggingface_hub stores LFS files as `blobs/<sha256 of the content>` and links
    `snapshots/<rev>/<name>` to them; small git files are named by their git sha1 (40 hex) instead,
    which is not a content sha256 and is ignored here."""
    if not os.path.islink(path):
        return None
    target = os.path.realpath(path)
    name = os.path.basename(target)
    if os.path.basename(os.path.dirname(target)) == "blobs" and _SHA256.match(name):
        return name
    return None
