"""`journalctl -k -b N ...` stand-in: the simulated host's kernel log of boot N (0 = this boot,
-1 = the one before), kept as files under the host root by the pieces that log something (a GPU
that fell off the bus). A boot with no file prints nothing, as a quiet kernel would. Any other use
is refused: gpubox reads only the kernel log this way."""

from __future__ import annotations

from ..core import SimBox, StandinError

LOG = "/var/log/gpubox-sim/kernel.b{boot}.log"


def main(sim: SimBox, argv: list[str]) -> int:
    if "-k" not in argv:
        raise StandinError("journalctl (simulated): only the kernel log (-k) is simulated", 1)
    boot = argv[argv.index("-b") + 1] if "-b" in argv else "0"
    p = sim.hpath(LOG.format(boot=boot))
    if p.exists():
        print(p.read_text(), end="")
    return 0
