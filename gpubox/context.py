"""What a step needs to run: the box, lazily connected hosts, options, and a console."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .host import Host, connect_box
from .inventory import Box, Inventory


@dataclass
class Context:
    box: Box
    inventory: Inventory | None = None
    options: dict[str, Any] = field(default_factory=dict)
    verbose: bool = False
    console: Any = None  # rich Console, or None when quiet/JSON
    _hosts: tuple[Host, Host] | None = None

    def _connect(self) -> tuple[Host, Host]:
        if self._hosts is None:
            self._hosts = connect_box(self.box)
        return self._hosts

    @property
    def host(self) -> Host:
        """The Proxmox host."""
        return self._connect()[0]

    @property
    def container(self) -> Host:
        return self._connect()[1]

    def opt(self, key: str, default: Any = None) -> Any:
        v = self.options.get(key)
        return default if v is None else v

    def close(self) -> None:
        if self._hosts:
            for h in self._hosts:
                h.close()
            self._hosts = None
