"""One operation as data (request.py), run as the payload that travels into a container."""

import json
import sys

from gpubox.provision import stage as st
from tests.stage.kit import (
    _files,
)


def test_payload_runs_with_stdlib_only(model, tmp_path):
    """What travels into a container without gpubox: the copier's payload (gpubox.transport.payload)
    with `--request JSON`, run in isolated mode without site-packages (no xxhash: crc32)."""
    from gpubox.transport import payload
    from gpubox.transport.local import LocalTransport

    dest = tmp_path / "d"
    req = {"op": "stage", "src": str(model), "dest": str(dest), "workers": 2}

    def run(r):
        return payload.run(
            LocalTransport(),
            "gpubox.provision.stage.__main__",
            ["--request", json.dumps(r)],
            python=sys.executable,
            flags=["-I", "-S"],
        )

    r = run(req)
    assert r.rc == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["copied"] == len(_files(model))
    man = json.loads((dest / st.MANIFEST).read_text())
    assert {e["algo"] for e in man["files"].values()} == {st.HASHES["crc32"]}
    r = run({**req, "op": "check"})
    assert r.rc == 0 and json.loads(r.stdout)["staged"] is True
    r = run({**req, "src": str(tmp_path / "nope")})
    assert r.rc == 2 and "is not a directory" in json.loads(r.stdout)["error"]
