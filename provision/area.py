"""What the provision area registers with the core (gpubox.areas): the LXC and staging steps,
their groups, the lxc/stage/recover commands, the pieces the simulated box builds with (the
persistence files, LXC's start model, the staging engine) and doctor. No heavy imports."""

from gpubox.areas import Area

AREA = Area(
    name="provision",
    providers=(
        (10, "gpubox.provision.lxc_step"),  # host-devices, container-config, container, cuda
        (30, "gpubox.provision.stage_step"),
        (35, "gpubox.provision.diag_steps"),  # docker-toolkit, shm-room (issue 28)
    ),  # model-stage, drafter-stage
    groups=(
        (10, "lxc", ("host-devices", "container-config", "container", "cuda")),
        (11, "devices", ("host-devices",)),
        (30, "stage", ("stage",)),
        (35, "diagnose", ("docker-toolkit", "shm-room")),
    ),  # prefix: every *-stage step
    commands={
        "doctor": "gpubox.provision.cli_recover:doctor",
        "recover": "gpubox.provision.cli_recover:recover",
        "demo": "gpubox.provision.cli_recover:demo",
        "lxc": "gpubox.provision.cli_lxc:lxc",
        "stage": "gpubox.provision.cli_stage:stage",
    },
    hooks={
        "sim.lxc": "gpubox.provision.lxc",  # persist_files
        "sim.lxcmodel": "gpubox.provision.lxcmodel",  # StartModel, host_rdev_under
        "sim.stage": "gpubox.provision.stage",  # stage
        "sim.safetensors": "gpubox.provision.safetensors_check",  # DTYPE_BYTES
        "doctor": "gpubox.provision.recover:doctor_dict",
    },  # bench's run-once exports it
)
