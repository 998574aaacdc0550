"""The model piece: a persistent model + drafter in the container, staged into /dev/shm.

The files are what a Hugging Face model directory holds (config.json, tokenizer files,
generation_config.json, model.safetensors.index.json and real safetensors shards: 8-byte header
length, JSON header, tensor bytes), only a few MB so the demo stays fast. Healthy means staged with
a valid manifest by the real copier (provision.stage); the faults undo parts of that.
"""

from __future__ import annotations

import json
import os
import random
import struct
from pathlib import Path

from ..provision import safetensors_check
from ..provision.stage import stage
from .core import SimBox

FAULTS = {
    "shm_empty": "/dev/shm in the container is empty after the reboot: model and drafter must be re-staged",
    "truncated_shard": "a staged shard in /dev/shm is truncated while its manifest is still there",
}

MODEL_SRC, MODEL_DEST = "/mnt/models/Qwen3.6-27B-sim", "/dev/shm/Qwen3.6-27B-sim"
DRAFTER_SRC, DRAFTER_DEST = "/mnt/models/Qwen3.6-27B-DFlash-sim", "/dev/shm/Qwen3.6-27B-DFlash-sim"
MODEL_SHARDS = [1_500_000, 1_200_000, 400_000]
DRAFTER_SHARDS = [600_000]
TENSOR_MAX = 64 << 20


def write_safetensors(path: str | os.PathLike, tensors: list[tuple[str, str, list[int]]], fill) -> int:
    """Write a .safetensors file: tensors are (name, dtype, shape); fill(n) returns n data bytes.

    Written by hand (the format is 8-byte LE header length + JSON header padded with spaces to 8
    bytes + the tensors back to back) so the benchmark can stream GB-sized shards without holding
    them in memory; tests load the result with the safetensors library to prove it is the real
    format. Returns the file size."""
    DTYPE_BYTES = safetensors_check.DTYPE_BYTES
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for name, dtype, shape in tensors:
        n = DTYPE_BYTES[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + n]}
        off += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        left = off
        while left:
            k = min(left, 16 << 20)
            f.write(fill(k))
            left -= k
    return 8 + len(raw) + off


def _tensors_for(nbytes: int, shard: int) -> list[tuple[str, str, list[int]]]:
    """BF16 matrices of 1024 columns adding up to about nbytes (at least one row)."""
    rows_total = max(1, nbytes // 2048)
    out, layer = [], 0
    rows_max = TENSOR_MAX // 2048
    while rows_total > 0:
        r = min(rows_total, rows_max)
        out.append((f"model.layers.{shard}.mlp.{layer}.weight", "BF16", [r, 1024]))
        rows_total -= r
        layer += 1
    return out


def make_model(
    dest: str | os.PathLike,
    shard_bytes: list[int],
    *,
    name: str = "Qwen3.6-27B-sim",
    tokenizer: bool = True,
    seed: int = 0,
    fill=None,
) -> dict[str, int]:
    """A model directory like the hub's: shards (indexed when more than one) + config/tokenizer.

    Returns {file: size}. `fill(n)` gives tensor bytes (default: seeded pseudo-random)."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    rnd = random.Random(seed)
    fill = fill or rnd.randbytes
    files: dict[str, int] = {}

    def put(rel: str, doc) -> None:
        (dest / rel).write_text(json.dumps(doc, indent=2) + "\n")
        files[rel] = (dest / rel).stat().st_size

    put(
        "config.json",
        {
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            "_name_or_path": name,
            "hidden_size": 1024,
            "num_hidden_layers": len(shard_bytes),
            "torch_dtype": "bfloat16",
            "max_position_embeddings": 131072,
            "vocab_size": 151936,
        },
    )
    put("generation_config.json", {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "do_sample": True})
    if tokenizer:
        put(
            "tokenizer.json",
            {
                "version": "1.0",
                "model": {"type": "BPE", "vocab": {"<|endoftext|>": 0}, "merges": []},
                "added_tokens": [{"id": 0, "content": "<|endoftext|>", "special": True}],
            },
        )
        put(
            "tokenizer_config.json",
            {"tokenizer_class": "Qwen2Tokenizer", "eos_token": "<|endoftext|>", "model_max_length": 131072},
        )
    n = len(shard_bytes)
    weight_map, total = {}, 0
    for i, size in enumerate(shard_bytes):
        rel = "model.safetensors" if n == 1 else f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        tensors = _tensors_for(size, i)
        files[rel] = write_safetensors(dest / rel, tensors, fill)
        for t, dtype, shape in tensors:
            weight_map[t] = rel
            total += 2 * shape[0] * shape[1]
    if n > 1:
        put("model.safetensors.index.json", {"metadata": {"total_size": total}, "weight_map": weight_map})
    return files


def build(sim: SimBox, faults: set[str]) -> None:
    # stage(): the staging engine `gpubox stage` runs

    make_model(sim.cpath(MODEL_SRC), MODEL_SHARDS, name="Qwen3.6-27B-sim", seed=1)
    make_model(sim.cpath(DRAFTER_SRC), DRAFTER_SHARDS, name="Qwen3.6-27B-DFlash-sim", tokenizer=False, seed=2)
    cg = sim.cpath("/sys/fs/cgroup")
    cg.mkdir(parents=True, exist_ok=True)
    if not (cg / "memory.max").exists():  # a 64 GiB container, 2 GiB in use before staging
        (cg / "memory.max").write_text(f"{64 << 30}\n")
        (cg / "memory.current").write_text(f"{2 << 30}\n")
    sim.inventory_extra["container"]["gpubox_model"] = {"source": MODEL_SRC, "dest": MODEL_DEST}
    sim.inventory_extra["container"]["gpubox_drafter"] = {"source": DRAFTER_SRC, "dest": DRAFTER_DEST}
    if "shm_empty" in faults:
        return
    for src, dest, tok in ((MODEL_SRC, MODEL_DEST, True), (DRAFTER_SRC, DRAFTER_DEST, False)):
        stage(
            str(sim.cpath(src)),
            str(sim.cpath(dest)),
            tmpfs=True,
            cgroup_dir=str(cg),
            workers=2,
            require_tokenizer=tok,
            source_info={"path": src},
        )
    if "truncated_shard" in faults:
        shard = sim.cpath(MODEL_DEST) / f"model-00002-of-{len(MODEL_SHARDS):05d}.safetensors"
        os.truncate(shard, shard.stat().st_size // 2)
