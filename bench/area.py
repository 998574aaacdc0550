"""What the bench area registers with the core (gpubox.areas): the bench step's group and the
bench/report/history/schedule commands. No heavy imports."""

from gpubox.areas import Area

AREA = Area(
    name="bench",
    # bench: server health + latest verdict (doctor only; recover runs the benchmark itself
    # after the repairs)
    groups={"bench": ("bench",)},
    commands={
        "bench": "gpubox.bench.cli:bench",
        "report": "gpubox.bench.cli_report:report",
        "advise": "gpubox.bench.cli_advise:advise",
        "history": "gpubox.bench.cli_history:history",
        "schedule": "gpubox.bench.cli_schedule:schedule",
    },
)
