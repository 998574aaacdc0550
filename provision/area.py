"""What the provision area registers with the core (gpubox.areas): the LXC and staging steps,
their groups, the lxc/stage/recover commands and doctor (for bench's scheduled run). No heavy
imports."""

from gpubox.areas import Area

AREA = Area(
    name="provision",
    providers=(
        (10, "gpubox.provision.lxc_step"),  # host-devices, container-config, container, cuda
        (30, "gpubox.provision.stage_step"),
    ),  # model-stage, drafter-stage
    groups=(
        (10, "lxc", ("host-devices", "container-config", "container", "cuda")),
        (11, "devices", ("host-devices",)),
        (30, "stage", ("stage",)),
    ),  # prefix: every *-stage step
    commands={
        "doctor": "gpubox.provision.cli_recover:doctor",
        "recover": "gpubox.provision.cli_recover:recover",
        "demo": "gpubox.provision.cli_recover:demo",
        "lxc": "gpubox.provision.cli_lxc:lxc",
        "stage": "gpubox.provision.cli_stage:stage",
    },
    hooks={
        "doctor": "gpubox.provision.recover:doctor_dict",
    },  # bench's run-once exports it
)
