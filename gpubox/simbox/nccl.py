"""The container's NCCL environment files: the server's EnvironmentFile and /etc/nccl.conf.

Healthy: the box's profile (gpubox_nccl_profile, pcie-2numa like the seed) rendered exactly as
`gpubox tune nccl` writes it. Faults reproduce what the seed's story found: the variables not
exported at all after a rebuild, and a hand-typed file with a misspelled name (which NCCL ignores
silently) and a misspelled protocol token (which NCCL rejects at init).
"""

from __future__ import annotations

from ..hwtune import nccl
from .core import SimBox

FAULTS = {
    "nccl_missing": "no NCCL environment file in the container (variables not exported)",
    "nccl_misspelled": "hand-written NCCL env with NCCL_MIN_NCHANNEL=8 and NCCL_PROTO=LL,Simpel",
}

PROFILE = "pcie-2numa"

# As typed from the team's notes: a name one letter short, a protocol typo, spaces nowhere.
MISSPELLED = """# NCCL settings from the tuning notes
NCCL_PROTO=LL,Simpel
NCCL_ALGO=Ring
NCCL_MIN_NCHANNEL=8
NCCL_DEBUG=WARN
"""


def build(sim: SimBox, faults: set[str]) -> None:
    # the files `gpubox tune nccl` writes, rendered by hwtune
    CONF_FILE, ENV_FILE, file_header, render = nccl.CONF_FILE, nccl.ENV_FILE, nccl.file_header, nccl.render

    sim.inventory_extra["container"]["gpubox_nccl_profile"] = PROFILE
    if "nccl_missing" in faults:
        return
    prof = nccl.load_profile(PROFILE)
    env_path, conf_path = sim.cpath(ENV_FILE), sim.cpath(CONF_FILE)
    env_path.parent.mkdir(parents=True, exist_ok=True)
    if "nccl_misspelled" in faults:
        env_path.write_text(MISSPELLED)
        conf_path.write_text(MISSPELLED)
        return
    env_path.write_text(render(prof.env, "envfile", header=file_header(prof, ENV_FILE)))
    conf_path.write_text(render(prof.env, "ncclconf", header=file_header(prof, CONF_FILE)))
