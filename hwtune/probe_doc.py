"""The probe document (gpubox.probe/1, what hwtune/probe.py prints) as one typed model.

`ProbeDoc.from_json` checks every field it knows against its type on load (a wrong type is one
line naming the field, exit 2) and is what the verdict, the probe step and the report read;
`to_json` gives the document back key for key as it was read (fields in their order, keys this
model does not know kept), so a report carries the probe's own document unchanged.

The probe script itself writes plain dicts: it runs on the target with the standard library only
and never imports this module. Every field may be absent (a section that was skipped has only a
status and a reason), so each one has a default: None, an empty list or mapping, or an empty record.
"""

from __future__ import annotations

import functools
import json
import types
import typing
from dataclasses import MISSING, dataclass, field, fields
from typing import ClassVar, TypeVar, Union

from gpubox.errors import GpuboxError

PROBE_SCHEMA = "gpubox.probe/1"
FIX = "give the JSON that hwtune/probe.py printed"
R = TypeVar("R", bound="Record")


@dataclass
class Record:
    """A JSON object with known fields: loaded with type checks, written back as it was read."""

    # keys the loaded object had, in its order, and the values of keys this model does not know
    json_keys: tuple[str, ...] = field(default=(), repr=False, compare=False)
    extra: dict[str, object] = field(default_factory=dict, repr=False)

    _OWN: ClassVar[frozenset[str]] = frozenset({"json_keys", "extra"})

    @classmethod
    def from_json(cls: type[R], data: object, where: str = "probe document:") -> R:
        """DATA checked and loaded; WHERE names it in errors ("SOURCE:" for a document's top)."""
        if not isinstance(data, dict):
            raise GpuboxError(f"{where.rstrip(':')} is {_short(data)}, not a JSON object", FIX)
        hints = _hints(cls)
        known = {f.name for f in fields(cls)} - cls._OWN
        kw = {k: _load(hints[k], v, _join(where, k)) for k, v in data.items() if k in known}
        rec = cls(**kw, json_keys=tuple(data), extra={k: v for k, v in data.items() if k not in known})
        rec.validate(where)
        return rec

    def validate(self, where: str) -> None:
        """Checks across fields, after each field's type was checked (none by default)."""

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {}
        mine = {f.name: f for f in fields(self) if f.name not in self._OWN}
        for k in self.json_keys:
            out[k] = _dump(getattr(self, k)) if k in mine else self.extra.get(k)
        for name, f in mine.items():  # set after loading, or on a record built in code
            if name not in out and getattr(self, name) != _default(f):
                out[name] = _dump(getattr(self, name))
        out.update({k: v for k, v in self.extra.items() if k not in out})
        return out


def _join(where: str, key: str) -> str:
    return f"{where} {key}" if where.endswith(":") else f"{where}.{key}"


def _short(v: object) -> str:
    text = json.dumps(v) if not isinstance(v, (set, bytes)) else repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, object]:
    return typing.get_type_hints(cls)


def _default(f) -> object:
    return f.default_factory() if f.default_factory is not MISSING else f.default


_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}


def _load(tp: object, v: object, where: str) -> object:
    """V checked against the type hint TP (X | None, list[X], dict[str, X], a Record, a scalar)."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if v is None:
            return None
        return _load(args[0], v, where)
    if origin is list:
        if not isinstance(v, list):
            raise GpuboxError(f"{where} is {_short(v)}, not a list", FIX)
        (item,) = typing.get_args(tp)
        return [_load(item, x, f"{where}[{i}]") for i, x in enumerate(v)]
    if origin is dict:
        if not isinstance(v, dict):
            raise GpuboxError(f"{where} is {_short(v)}, not a JSON object", FIX)
        _, item = typing.get_args(tp)
        return {k: _load(item, x, _join(where, k)) for k, x in v.items()}
    if isinstance(tp, type) and issubclass(tp, Record):
        return tp.from_json(v, where)
    if tp is object:
        return v
    ok = (
        isinstance(v, (int, float)) and not isinstance(v, bool)
        if tp is float
        else isinstance(v, tp) and not (tp is int and isinstance(v, bool))
    )
    if not ok:
        raise GpuboxError(f"{where} is {_short(v)}, not {_NAMES.get(tp, tp)}", FIX)
    return v


def _dump(v: object) -> object:
    if isinstance(v, Record):
        return v.to_json()
    if isinstance(v, list):
        return [_dump(x) for x in v]
    if isinstance(v, dict):
        return {k: _dump(x) for k, x in v.items()}
    return v


# -- per GPU (nvml.gpus[]) ------------------------------------------------------------------------
@dataclass
class PcieFacts(Record):
    gen_current: int | None = None
    gen_max: int | None = None  # the GPU and system limit
    gen_gpu_max: int | None = None  # the GPU's own limit
    width_current: int | None = None
    width_max: int | None = None
    replay_counter: int | None = None


@dataclass
class EccCounts(Record):
    enabled: bool | None = None
    volatile_uncorrected: int | None = None
    aggregate_uncorrected: int | None = None
    volatile_corrected: int | None = None


@dataclass
class RetiredPages(Record):
    sbe: int | None = None
    dbe: int | None = None
    pending: bool | None = None


@dataclass
class RemappedRows(Record):
    correctable: int | None = None
    uncorrectable: int | None = None
    pending: bool | None = None
    failure: bool | None = None


@dataclass
class ClockReasons(Record):
    mask: int | None = None
    active: list[str] = field(default_factory=list)


@dataclass
class Clocks(Record):
    sm: int | None = None
    mem: int | None = None
    sm_max: int | None = None
    mem_max: int | None = None


@dataclass
class AppClocks(Record):
    sm: int | None = None
    sm_default: int | None = None
    mem: int | None = None
    mem_default: int | None = None


@dataclass
class MigMode(Record):
    current: int | None = None
    pending: int | None = None


@dataclass
class Fabric(Record):
    state: str | None = None  # not_supported | not_started | in_progress | completed
    status: int | None = None
    clique: int | None = None
    health_mask: int | None = None


@dataclass
class Numa(Record):
    node: int | None = None
    source: str | None = None  # nvml | sysfs | cpu_affinity


@dataclass
class NvLink(Record):
    link: int | None = None
    active: bool | None = None
    version: int | None = None  # nvml.h's NVML_NVLINK_VERSION_* enum, not the version number
    remote: str | None = None
    remote_type: str | None = None  # gpu | ibmnpu | switch
    speed_mbps: int | None = None


@dataclass
class NvLinks(Record):
    links: list[NvLink] = field(default_factory=list)
    active: int | None = None
    speed_mbps_common: int | None = None


@dataclass
class GpuFacts(Record):
    index: int | None = None
    error: str | None = None  # NVML could not open the GPU (e.g. GPU_IS_LOST): nothing else is known
    name: str | None = None
    uuid: str | None = None
    bus_id: str | None = None
    pci_device_id: str | None = None
    compute_capability: str | None = None
    memory_total_mib: int | None = None
    memory_used_mib: int | None = None
    persistence_mode: bool | None = None
    mig_mode: MigMode | None = None
    pcie: PcieFacts = field(default_factory=PcieFacts)
    ecc: EccCounts = field(default_factory=EccCounts)
    retired_pages: RetiredPages | None = None
    remapped_rows: RemappedRows | None = None
    clock_event_reasons: ClockReasons | None = None
    clocks_mhz: Clocks | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    power_default_w: float | None = None
    fabric: Fabric | None = None
    app_clocks_mhz: AppClocks | None = None
    numa: Numa | None = None
    nvlink: NvLinks | None = None
    unsupported: dict[str, str] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"gpu{self.index}"

    @property
    def idle_reasons(self) -> list[str]:
        return self.clock_event_reasons.active if self.clock_event_reasons else []


# -- sections -------------------------------------------------------------------------------------
@dataclass
class NvmlSection(Record):
    status: str | None = None
    reason: str | None = None
    driver: str | None = None
    cuda_driver: str | None = None
    nvml: str | None = None
    kernel_module: str | None = None
    gpus: list[GpuFacts] = field(default_factory=list)
    unsupported: dict[str, str] = field(default_factory=dict)


@dataclass
class TorchSection(Record):
    status: str | None = None
    reason: str | None = None
    version: str | None = None
    cuda: str | None = None
    device_count: int | None = None
    nccl: str | None = None
    nccl_error: str | None = None


@dataclass
class LinkNow(Record):
    gen: int | None = None
    width: int | None = None


# Measurements whose "ok" means a copy rate was taken (the all-reduce reports busbw instead).
RATE_PROBES = ("h2d", "d2h", "d2d", "p2p")


@dataclass
class BandwidthProbe(Record):
    """One measurement: a host copy (h2d/d2h) or device copy (d2d) of one GPU, a GPU pair's copy
    (p2p), or an all-reduce over a GPU set. Fields that do not belong to its kind stay unset."""

    name: str | None = None  # h2d | d2h | d2d | p2p | allreduce
    status: str | None = None
    reason: str | None = None
    gpu: int | None = None  # torch index (host and device copies)
    bus_id: str | None = None
    src: int | None = None  # p2p: torch indexes
    dst: int | None = None
    gpus: list[int] = field(default_factory=list)  # allreduce: torch indexes
    peer_access: bool | None = None
    bytes: int | None = None
    iters: int | None = None
    counting: str | None = None  # d2d: "read+write"
    gbps: float | None = None
    gbps_best: float | None = None
    gbps_worst: float | None = None
    trials: int | None = None
    link_under_load: LinkNow | None = None
    clock_event_reasons_under_load: ClockReasons | None = None
    algbw_gbps: float | None = None
    busbw_gbps: float | None = None
    busbw_factor: float | None = None

    def validate(self, where: str) -> None:
        if self.status == "ok" and self.name in RATE_PROBES and self.gbps is None:
            raise GpuboxError(f"{where} ({self.name}) is ok but has no gbps", FIX)


@dataclass
class BandwidthSection(Record):
    status: str | None = None
    reason: str | None = None
    mode: str | None = None  # quick | full
    devices: int | None = None
    gpu_bus_ids: list[str | None] = field(default_factory=list)  # by torch index
    probes: list[BandwidthProbe] = field(default_factory=list)


@dataclass
class XidEvent(Record):
    bus_id: str | None = None
    xid: int | None = None


@dataclass
class XidSection(Record):
    status: str | None = None
    reason: str | None = None
    window_s: float | None = None
    watched: list[str] = field(default_factory=list)
    events: list[XidEvent] = field(default_factory=list)


@dataclass
class ProbeDoc(Record):
    schema: str = PROBE_SCHEMA
    started_at: str | None = None
    host: str | None = None
    python: str | None = None
    cuda_visible_devices: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    nvml: NvmlSection = field(default_factory=NvmlSection)
    torch: TorchSection = field(default_factory=TorchSection)
    bandwidth: BandwidthSection = field(default_factory=BandwidthSection)
    xid: XidSection = field(default_factory=XidSection)
    seconds: float | None = None

    def validate(self, where: str) -> None:
        if self.schema != PROBE_SCHEMA:
            raise GpuboxError(f"{where} is not a {PROBE_SCHEMA} document", FIX)

    @classmethod
    def of(cls, doc: ProbeDoc | dict[str, object]) -> ProbeDoc:
        """A document given either way: the model as is, a mapping loaded (and checked)."""
        return doc if isinstance(doc, ProbeDoc) else cls.from_json(doc)

    @functools.cached_property
    def raw(self) -> dict[str, object]:
        """The document as JSON, once (for readers that take the mapping: hwtune/links.py)."""
        return self.to_json()

    # -- lookups the verdict and the reports share --------------------------------------------
    @property
    def gpus(self) -> list[GpuFacts]:
        return self.nvml.gpus

    @property
    def probes(self) -> list[BandwidthProbe]:
        return self.bandwidth.probes

    def bus_of(self, torch_index: int | None) -> str | None:
        """The bus id of a torch device index (the bandwidth section records them)."""
        ids = self.bandwidth.gpu_bus_ids
        if torch_index is not None and 0 <= torch_index < len(ids):
            return ids[torch_index]
        return None

    def gpu_for(self, bus_id: str | None, index: int | None) -> GpuFacts | None:
        """The NVML record of a device: by bus id, else (no bus id known) by index."""
        for g in self.gpus:
            if bus_id and g.bus_id == bus_id:
                return g
        if bus_id is None and index is not None and index < len(self.gpus):
            return self.gpus[index]
        return None

    def gpu_of(self, torch_index: int | None) -> GpuFacts | None:
        return self.gpu_for(self.bus_of(torch_index), torch_index)


def parse(text: str, source: str = "probe") -> ProbeDoc:
    """The probe's stdout -> its document; anything else is a one-line error."""
    text = (text or "").strip()
    start = text.find("{")
    try:
        data = json.loads(text[start:] if start >= 0 else text)
    except ValueError:
        tail = text.splitlines()[-1:] or ["(no output)"]
        raise GpuboxError(
            f"{source} did not print probe JSON: {tail[0][:200]}",
            "run it by hand with -v, or check the interpreter (gpubox_probe.python)",
        ) from None
    if not isinstance(data, dict) or data.get("schema") != PROBE_SCHEMA:
        raise GpuboxError(f"{source} is not a {PROBE_SCHEMA} document", FIX)
    return ProbeDoc.from_json(data, f"{source}:")
