"""The integrity check of a model directory (provision/safetensors_check.py)."""

import json

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
