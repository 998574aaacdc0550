"""Ways to reach a host: local processes, SSH (paramiko), `pct exec` through a Proxmox host."""

from .base import CmdResult, FileStat, Transport
from .local import LocalTransport

__all__ = ["CmdResult", "FileStat", "Transport", "LocalTransport"]
