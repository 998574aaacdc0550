"""A Hugging Face repo's snapshot folder in the container's cache, found (or downloaded) there:
`hf_snapshot.py '{"repo": ..., "revision": ..., "cache_dir": ..., "local_only": ...}'`.

Runs inside the container as a payload (gpubox.transport.payload), with the container's python3,
which must have huggingface_hub; stage_step calls `snapshot_download` in-process for a local
container. Prints the snapshot's path, or `{"error": ...}` and exits 3.
"""

import json
import sys


def main(argv=None) -> int:
    a = json.loads((sys.argv[1:] if argv is None else argv)[0])
    from huggingface_hub import snapshot_download

    try:
        path = snapshot_download(
            a["repo"],
            revision=a.get("revision"),
            cache_dir=a.get("cache_dir"),
            local_files_only=a["local_only"],
        )
    except Exception as e:  # huggingface_hub raises many kinds (offline, not cached, 404)
        print(json.dumps({"error": f"{type(e).__name__}: {e}"}))
        return 3
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
