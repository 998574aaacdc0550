"""gpubox: recover and verify a self-hosted GPU inference box after a reboot."""

__version__ = "0.1.0"
