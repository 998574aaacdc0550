"""gpubox: recover and verify a self-hosted GPU inference box after a reboot."""

import os as _os

__version__ = "0.1.0"

# gpubox.bench, gpubox.hwtune and gpubox.provision live in the checkout's top-level bench/, hwtune/
# and provision/ folders (pyproject.toml's package-dir; the wheel has them under gpubox/, and the
# editable install's finder maps them too, even when the checkout's ./gpubox is found first). A
# checkout used without any install (`PYTHONPATH=$PWD python3 -m ...`: tests/hostile, the device
# runs, benchmarks/) has only this folder as gpubox's search path, so the folder above is searched
# as well: the same mapping, made explicit. A wheel has gpubox/bench and skips this.
_here = _os.path.dirname(_os.path.abspath(__file__))
_checkout = _os.path.dirname(_here)
if not _os.path.isdir(_os.path.join(_here, "bench")) and _os.path.isfile(
    _os.path.join(_checkout, "bench", "area.py")
):
    __path__.append(_checkout)
