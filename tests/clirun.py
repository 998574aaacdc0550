"""Run the `gpubox` CLI in-process the way the console script does (gpubox.cli.main, which always
exits), capturing exit status, stdout and stderr. Fast: no new interpreter, no re-import of
Ansible. Tests that need the real installed script use subprocess instead."""

from __future__ import annotations

import pytest


def gpubox(capsys, *argv: str) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `gpubox ARGV...`."""
    from gpubox.cli import main

    capsys.readouterr()  # drop anything printed before
    with pytest.raises(SystemExit) as ei:
        main([str(a) for a in argv])
    out, err = capsys.readouterr()
    code = ei.value.code
    return (0 if code is None else int(code)), out, err


# gpubox as a person runs it at a terminal: SIGINT at its default, whatever this test process
# inherited. A shell without job control starts background jobs with SIGINT ignored (`cmd &` in
# a script, nohup from one), the ignore survives exec, and Python then installs no handler: Ctrl-C
# would do nothing and the run would wait at the prompt for ever (seen when the suite was run so).
AT_A_TERMINAL = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.executable, [sys.executable, '-m', 'gpubox.cli', *sys.argv[1:]])"
)
