"""What the hwtune area registers with the core (gpubox.areas): its --skip/--only groups and
commands. No heavy imports."""

from gpubox.areas import Area

AREA = Area(
    name="hwtune",
    groups={
        "tune": ("pcie-mrrs", "pcie-link", "numa-balancing"),
        "nccl": ("nccl-env",),
        "acs": ("pcie-acs",),
        "probe": ("gpu-probe",),
    },
    commands={
        "tune": "gpubox.hwtune.commands.tune:tune",
        "nccl": "gpubox.hwtune.commands.nccl:nccl",
        "gpus": "gpubox.hwtune.commands.gpus:gpus",
        "probe": "gpubox.hwtune.commands.probe:probe",
    },
)
