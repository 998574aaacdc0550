"""What the provision area registers with the core (gpubox.areas): the --skip/--only groups of
its LXC and staging steps, the lxc/stage/recover commands and doctor (for bench's scheduled
run). No heavy imports."""

from gpubox.areas import Area

AREA = Area(
    name="provision",
    groups={
        "lxc": ("host-devices", "container-config", "container", "cuda"),
        "devices": ("host-devices",),
        "stage": ("model-stage", "drafter-stage"),
        "diagnose": ("docker-toolkit", "shm-room"),
    },
    commands={
        "doctor": "gpubox.provision.cli_recover:doctor",
        "recover": "gpubox.provision.cli_recover:recover",
        "demo": "gpubox.provision.cli_recover:demo",
        "lxc": "gpubox.provision.cli_lxc:lxc",
        "stage": "gpubox.provision.cli_stage:stage",
        "autostart": "gpubox.provision.cli_autostart:autostart",
    },
    hooks={"doctor": "gpubox.provision.recover:doctor_dict"},  # bench's run-once exports it
)
