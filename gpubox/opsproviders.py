"""Hosts whose files follow rules of their own (gpubox.transport.fsops.FileOps): functions
HostEntry -> FileOps | None, asked in order when a local transport is made (gpubox.host). The code
that knows such hosts registers one: the simulator, for the pmxcfs rules of a simulated box's
/etc/pve.

A module of its own, importing nothing: registering must not load the transports, since the
simulator's stand-in commands (a process per simulated `pct`, `journalctl`, ...) import the
simulator's package and never reach a host."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from .inventory import HostEntry
    from .transport.fsops import FileOps

OPS_PROVIDERS: list[Callable[[HostEntry], FileOps | None]] = []


def register_ops_provider(fn: Callable[[HostEntry], FileOps | None]) -> None:
    if fn not in OPS_PROVIDERS:
        OPS_PROVIDERS.append(fn)
