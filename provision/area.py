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
        "diagnose": ("driver-packages", "kernel-log", "docker-toolkit", "shm-room"),
    },
    commands={
        "doctor": "gpubox.provision.commands.doctor:doctor",
        "recover": "gpubox.provision.commands.recover:recover",
        "demo": "gpubox.provision.commands.demo:demo",
        "lxc": "gpubox.provision.commands.lxc:lxc",
        "stage": "gpubox.provision.commands.stage:stage",
        "backups": "gpubox.provision.commands.backups:backups",
        "autostart": "gpubox.provision.commands.autostart:autostart",
    },
    hooks={"doctor": "gpubox.provision.recover:doctor_dict"},  # bench's run-once exports it
)
