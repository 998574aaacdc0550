"""What every part of the GPU health probe script shares: the document's schema name, bus-id
normalising, error text, and the NVML field reader that records what a GPU does not support.

Standard library only: the probe runs on the target with whatever python3 is there
(hwtune/probe.py says how).
"""

from __future__ import annotations

SCHEMA = "gpubox.probe/1"
MIB = 1 << 20


def as_text(v):
    """pynvml returns bytes in old releases and str in new ones."""
    return v.decode(errors="replace") if isinstance(v, (bytes, bytearray)) else v


def norm_bdf(bus_id: str) -> str:
    """'00000000:17:00.0' (NVML) or '0000:17:00.0' (sysfs) -> '0000:17:00.0'."""
    bus_id = as_text(bus_id).strip().lower()
    parts = bus_id.split(":")
    if len(parts) != 3:
        return bus_id
    dom, bus, devfn = parts
    dev, _, fn = devfn.partition(".")
    return f"{int(dom, 16):04x}:{int(bus, 16):02x}:{int(dev, 16):02x}.{int(fn or '0', 16)}"


def error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".strip().rstrip(":")


class NvmlFields:
    """Reads NVML fields one by one; a field the GPU or driver does not support is recorded in
    `unsupported`, not fatal (NVML answers NOT_SUPPORTED for e.g. page retirement on Hopper)."""

    def __init__(self, nv):
        self.nv = nv
        self.unsupported: dict[str, str] = {}

    def get(self, name, fn, *args):
        try:
            return fn(*args)
        except self.nv.NVMLError as exc:
            self.unsupported[name] = str(exc)
        except (AttributeError, TypeError) as exc:  # function missing in this pynvml release
            self.unsupported[name] = error_text(exc)
        return None
