"""Stand-in for the get-pip.py that ansible-test downloads from ci-files.testing.ansible.com (not
reachable from CI): pip comes from the interpreter's own ensurepip wheel, then pip installs what
ansible-test asked for (pip==X from PyPI). ansible-test runs this file with get-pip's arguments."""

import subprocess
import sys

subprocess.check_call([sys.executable, "-m", "ensurepip", "--default-pip"], stdout=subprocess.DEVNULL)
args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
if any(not a.startswith("-") for a in args):
    subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", *args])
