"""What a step needs to run: the box, lazily connected hosts, options, a console, and the facts
read so far in this run (cached, like pyinfra's `host.get_fact`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .facts import Fact, FactCache
from .host import Host, connect_box
from .inventory import Box, Inventory

# One persistence default for every command (doctor, recover, lxc, tune, Ansible): host repairs
# are made to survive the next reboot and checks look for that, unless --no-persist. A command
# that defaulted otherwise would call a box ok that the others call "boot persistence missing".
PERSIST_DEFAULT = True


@dataclass
class Context:
    box: Box
    inventory: Inventory | None = None
    options: dict[str, Any] = field(default_factory=dict)
    verbose: bool = False
    console: Any = None  # rich Console, or None when quiet/JSON
    # what a step kept for a later step of the same run (not a fact: `forget` keeps it), e.g. the
    # plan container-config showed before host-devices loaded nvidia-uvm (provision.container_config_step)
    memo: dict[str, Any] = field(default_factory=dict)
    _hosts: tuple[Host, Host] | None = None
    _facts: FactCache = field(default_factory=FactCache)

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

    def fact(self, fact: type[Fact], *args: Any) -> Any:
        """A fact's parsed value, read once per run (until `forget`)."""
        return self._facts.get(self, fact, *args)

    def know(self, fact: type[Fact], value: Any, *args: Any) -> None:
        """Take a fact's value read elsewhere (e.g. sent in a request) as this run's reading."""
        self._facts.put(fact, value, *args)

    def forget(self, where: str | None = None) -> None:
        """Drop cached facts (after a change, so verify reads the host again)."""
        self._facts.forget(where)

    def opt(self, key: str, default: Any = None) -> Any:
        v = self.options.get(key)
        return default if v is None else v

    def close(self) -> None:
        if self._hosts:
            for h in self._hosts:
                h.close()
            self._hosts = None
