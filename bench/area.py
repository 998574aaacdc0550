"""What the bench area registers with the core (gpubox.areas): the bench step's group and the
bench/report/history/schedule commands. No heavy imports."""

from gpubox.areas import Area

AREA = Area(
    name="bench",
    # bench: server health + latest verdict (doctor only; recover runs the benchmark itself
    # after the repairs)
    groups={"bench": ("bench",)},
    commands={
        "bench": "gpubox.bench.commands.bench:bench",
        "report": "gpubox.bench.commands.report:report",
        "advise": "gpubox.bench.commands.advise:advise",
        "history": "gpubox.bench.commands.history:history",
        "schedule": "gpubox.bench.commands.schedule:schedule",
    },
)
