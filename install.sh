#!/bin/sh
# Install gpubox from this checkout into its own venv, using the distribution's python3.
#
# Why a venv made by this script: Debian 12/13 (Proxmox VE 8/9) mark /usr/bin/python3 as externally
# managed (PEP 668), so `pip install` into it is refused, and it should be: apt owns it. A venv under
# /opt/gpubox owns nothing of the system, is removed with `rm -rf /opt/gpubox /usr/local/bin/gpubox`,
# and needs only python3-venv from Debian itself (pipx would work too, but puts root's tools under
# /root/.local and is one more thing to install and trust).
#
#   ./install.sh            /opt/gpubox/venv (root) or ~/.local/share/gpubox/venv, gpubox linked in
#                           /usr/local/bin (root) or ~/.local/bin
#   ./install.sh --dev      .venv in this checkout, editable, with the test extra (pytest, ansible-lint)
#
# GPUBOX_PYTHON picks the interpreter (default /usr/bin/python3: the distribution's, not a pyenv or
# conda python3 that may come first on PATH); GPUBOX_PREFIX the install directory, GPUBOX_BINDIR
# where the gpubox link goes.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
py=${GPUBOX_PYTHON:-/usr/bin/python3}
[ -x "$py" ] || py=$(command -v python3) || { echo "install.sh: no python3; apt-get install python3" >&2; exit 2; }

# pip's arguments as positional parameters, never one word-split string: a checkout path with a
# space (".../gpubox copy") stays one argument.
if [ "${1:-}" = "--dev" ]; then
    venv=$here/.venv
    set -- -e "$here[test]"
    bindir=""
else
    if [ "$(id -u)" -eq 0 ]; then prefix=${GPUBOX_PREFIX:-/opt/gpubox}; bindir=${GPUBOX_BINDIR:-/usr/local/bin}
    else prefix=${GPUBOX_PREFIX:-$HOME/.local/share/gpubox}; bindir=${GPUBOX_BINDIR:-$HOME/.local/bin}; fi
    venv=$prefix/venv
    set -- "$here"
fi

# Debian splits venv/ensurepip into python3-venv; say so instead of pip's long error.
if ! "$py" -c 'import ensurepip, venv' 2>/dev/null; then
    echo "install.sh: $py has no venv module; apt-get install python3-venv" >&2
    exit 2
fi
# An existing venv is reused only when it runs and was made by this same interpreter: one made by
# another python (a pyenv build, an older Debian's python3 after an upgrade) fails with "bad
# interpreter" or installs for the wrong version. Anything else is made anew (--clear: the venv is
# ours, at the path this script chose).
made_by() { "$venv/bin/python" -c 'import os, sys; print(os.path.realpath(sys._base_executable))' 2>/dev/null; }
if [ -x "$venv/bin/python" ] && [ "$(made_by)" = "$("$py" -c 'import os, sys; print(os.path.realpath(sys.executable))')" ]; then
    :
elif [ -e "$venv" ]; then
    echo "install.sh: $venv was made by another interpreter; making it anew with $py"
    "$py" -m venv --clear "$venv"
else
    "$py" -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip
"$venv/bin/python" -m pip install -q --disable-pip-version-check "$@"
[ -x "$venv/bin/gpubox" ] || { echo "install.sh: pip did not install $venv/bin/gpubox" >&2; exit 2; }

if [ -n "$bindir" ]; then
    mkdir -p "$bindir"
    link=$bindir/gpubox
    # A real file or directory there is someone else's: refuse. A symlink (ours, stale, or one
    # pointing at a directory) is replaced itself: -n, or ln would follow it into the directory.
    if [ -e "$link" ] && [ ! -L "$link" ]; then
        echo "install.sh: $link exists and is not a symlink; move it away and re-run" >&2
        exit 2
    fi
    ln -sfn "$venv/bin/gpubox" "$link"
    [ "$(readlink "$link")" = "$venv/bin/gpubox" ] || { echo "install.sh: could not link $link" >&2; exit 2; }
    echo "gpubox installed in $venv, linked as $link"
    # The playbooks run with the ansible-core gpubox depends on: link its commands too, but never
    # over an Ansible the machine already has (a file, or a link that is not into our venv).
    for tool in ansible-playbook ansible-galaxy ansible-inventory; do
        t=$bindir/$tool
        [ -x "$venv/bin/$tool" ] || continue
        case "$(readlink "$t" 2>/dev/null)" in
            "$venv"/*) ;;
            "") if [ -e "$t" ] || [ -L "$t" ]; then continue; fi ;;
            *) continue ;;
        esac
        ln -sfn "$venv/bin/$tool" "$t" && echo "  $tool linked as $t"
    done
else
    echo "gpubox (editable, with test tools) installed in $venv; run: $venv/bin/python -m pytest -q"
fi
