"""`python3 -m gpubox.provision.stage SRC DEST ...` and the copier's payload entry (what
gpubox.transport.payload runs in a container): only the command line, so the package it runs in
is imported once, as the package (request.main does the work)."""

import sys

from .request import main

if __name__ == "__main__":
    sys.exit(main())
