"""The integrity check of a model directory (provision/safetensors_check.py)."""

import json

import pytest

from gpubox.provision import safetensors_check as stc


def test_written_shards_are_real_safetensors(model):
    from safetensors import safe_open

    idx = json.loads((model / "model.safetensors.index.json").read_text())
    for shard in sorted(set(idx["weight_map"].values())):
        with safe_open(str(model / shard), framework="numpy") as f:
            for name in f.keys():
                assert idx["weight_map"][name] == shard
                n_hdr, hdr = stc.read_header(str(model / shard))
                assert f.get_slice(name).get_shape() == hdr[name]["shape"]


def test_header_checks(tmp_path):
    p = tmp_path / "x.safetensors"
    p.write_bytes(b"\x05\x00")
    assert "too short" in stc.check_shard(str(p))[0][0]
    p.write_bytes((10).to_bytes(8, "little") + b"{not json}")
    assert "not JSON" in stc.check_shard(str(p))[0][0]
    hdr = json.dumps({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 12]}}).encode()
    p.write_bytes(len(hdr).to_bytes(8, "little") + hdr + b"\0" * 12)
    assert "needs 16 bytes, offsets give 12" in stc.check_shard(str(p))[0][0]
    hdr = json.dumps({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}).encode()
    p.write_bytes(len(hdr).to_bytes(8, "little") + hdr + b"\0" * 20)
    assert "has trailing bytes" in stc.check_shard(str(p))[0][0]


# -- single-file models: one .gguf or one .safetensors is a model ------------------------------
def _gguf(path, version: int = 3, magic: bytes = b"GGUF") -> None:
    """A tiny GGUF file: magic, version (uint32 LE), then tensor and metadata counts (uint64 LE)."""
    path.write_bytes(magic + version.to_bytes(4, "little") + (0).to_bytes(8, "little") * 2)


def _safetensors(path, data: bytes = b"\0" * 16) -> None:
    hdr = json.dumps({"w": {"dtype": "F32", "shape": [len(data) // 4], "data_offsets": [0, len(data)]}})
    path.write_bytes(len(hdr).to_bytes(8, "little") + hdr.encode() + data)


def test_a_directory_of_one_gguf_or_one_safetensors_is_a_complete_model(tmp_path):
    """No config.json, no tokenizer, no index: the one weights file's header is the check (a README
    beside it changes nothing); as a main model and as a drafter."""
    g, s = tmp_path / "g", tmp_path / "s"
    g.mkdir()
    s.mkdir()
    _gguf(g / "model-Q4_K_M.gguf")
    (g / "README.md").write_text("a quantised model\n")
    _safetensors(s / "model.safetensors")
    for d, weights in ((g, "model-Q4_K_M.gguf"), (s, "model.safetensors")):
        assert stc.single_file_model({r.name: None for r in d.iterdir()}) == weights
        assert stc.check_model(str(d)) == []
        assert stc.check_model(str(d), require_tokenizer=False) == []


@pytest.mark.parametrize("version", [1, 2, 3])
def test_every_defined_gguf_version_passes(tmp_path, version):
    _gguf(tmp_path / "m.gguf", version=version)
    assert stc.check_gguf(str(tmp_path / "m.gguf")) == []


@pytest.mark.parametrize(
    "write,problem",
    [
        (lambda p: _gguf(p, magic=b"GGML"), "m.gguf: not a GGUF file (magic b'GGML', not b'GGUF')"),
        (lambda p: _gguf(p, version=0), "m.gguf: GGUF version 0, not one of 1, 2, 3"),
        (lambda p: _gguf(p, version=4), "m.gguf: GGUF version 4, not one of 1, 2, 3"),
        (lambda p: _gguf(p, version=3 << 24), "m.gguf: GGUF version 50331648, not one of 1, 2, 3"),
        (lambda p: p.write_bytes(b"GGUF\3"), "m.gguf: 5 bytes, too short for a GGUF header"),
    ],
    ids=["magic", "version 0", "version 4", "big-endian", "short"],
)
def test_a_bad_gguf_header_is_the_one_problem_of_a_single_file_model(tmp_path, write, problem):
    write(tmp_path / "m.gguf")
    assert stc.check_model(str(tmp_path)) == [problem]


def test_a_bad_safetensors_header_is_the_one_problem_of_a_single_file_model(tmp_path):
    p = tmp_path / "model.safetensors"
    p.write_bytes((10).to_bytes(8, "little") + b"{not json}")
    (problem,) = stc.check_model(str(tmp_path))
    assert problem.startswith("model.safetensors: header is not JSON")


@pytest.mark.parametrize(
    "files,missing",
    [
        # a Hugging Face layout (config.json beside the one shard) still needs its tokenizer
        ({"config.json": "{}", "model.safetensors": None}, ["no tokenizer"]),
        # two weights files, or one in a subdirectory, or an index: not a single-file model
        ({"a.gguf": None, "b.gguf": None}, ["config.json is missing", "no tokenizer"]),
        ({"sub/m.gguf": None}, ["config.json is missing", "no tokenizer"]),
        ({"m.gguf": None, "extra.bin": b"x"}, ["config.json is missing", "no tokenizer"]),
    ],
    ids=["config beside", "two ggufs", "in a subdirectory", "beside a .bin"],
)
def test_what_is_not_a_single_file_model_is_checked_as_before(tmp_path, files, missing):
    for rel, content in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if rel.endswith(".gguf"):
            _gguf(p)
        elif rel.endswith(".safetensors"):
            _safetensors(p)
        else:
            p.write_bytes(content if isinstance(content, bytes) else content.encode())
    problems = stc.check_model(str(tmp_path))
    assert [next((m for m in missing if p.startswith(m)), p) for p in problems] == missing
    assert stc.single_file_model({r: None for r in files}) is None
