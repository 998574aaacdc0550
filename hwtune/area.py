"""What the hwtune area registers with the core (gpubox.areas): its steps, groups and commands.
No heavy imports."""

from gpubox.areas import Area

AREA = Area(
    name="hwtune",
    providers=(
        (20, "gpubox.hwtune"),  # pcie-mrrs, pcie-link, numa-balancing, nccl-env
        (40, "gpubox.hwtune.probe_step"),
    ),  # gpu-probe (checks only)
    groups=(
        (20, "tune", ("pcie-mrrs", "pcie-link", "numa-balancing")),
        (21, "nccl", ("nccl-env",)),
        (40, "probe", ("gpu-probe",)),
    ),
    commands={
        "tune": "gpubox.hwtune.cli:tune",
        "nccl": "gpubox.hwtune.cli:nccl",
        "gpus": "gpubox.hwtune.cli:gpus",
        "probe": "gpubox.hwtune.cli_probe:probe",
    },
)
