"""What the hwtune area registers with the core (gpubox.areas): its steps, groups, commands and
the pieces the simulated box renders with (the files `gpubox tune` writes). No heavy imports."""

from gpubox.areas import Area

AREA = Area(
    name="hwtune",
    providers=(
        (20, "gpubox.hwtune"),  # pcie-mrrs, pcie-link, numa-balancing, nccl-env
        (22, "gpubox.hwtune.acs"),  # pcie-acs (reports only)
        (40, "gpubox.hwtune.probe_step"),
    ),  # gpu-probe (checks only)
    groups=(
        (20, "tune", ("pcie-mrrs", "pcie-link", "numa-balancing")),
        (21, "nccl", ("nccl-env",)),
        (22, "acs", ("pcie-acs",)),
        (40, "probe", ("gpu-probe",)),
    ),
    commands={
        "tune": "gpubox.hwtune.cli:tune",
        "nccl": "gpubox.hwtune.cli:nccl",
        "gpus": "gpubox.hwtune.cli:gpus",
        "probe": "gpubox.hwtune.cli_probe:probe",
    },
    hooks={
        "sim.numa": "gpubox.hwtune.numa",  # CONF, conf_text
        "sim.pcie": "gpubox.hwtune.pcie",  # UNIT, UNIT_PATH, parse_mrrs, read_states, unit_text
        "sim.nccl": "gpubox.hwtune.nccl",
    },  # CONF_FILE, ENV_FILE, file_header, load_profile, render
)
