"""NCCL environment profiles shipped with gpubox (YAML data; a package so they install with it)."""
