"""The far end of gpubox's payload runner (gpubox/transport/payload.py): runs in the box's python3,
which has no gpubox. STANDALONE and stdlib-only, Python >= 3.6: this file's source travels on
stdin, read and exec'd by the one-line `-c` bootstrap (payload.BOOT).

What arrives on stdin, after this source:
    <nonce> <minimum python>\\n<length of the zip>\\n<the zip>[the entry's own stdin, if any]
and in argv: ENTRY DIGEST ARGS... (ENTRY a dotted module, DIGEST the zip's sha256 prefix).

The zip is opened from memory and its modules are served by a meta-path finder placed first, so
the payload's `gpubox` package wins over any installed one and nothing is written on the box: a
killed run leaves no file behind (zipimport, as Ansible's AnsiballZ uses it, needs the zip on
disk, and a temporary file is what a SIGKILL leaves). The entry runs as `__main__` through runpy,
exactly as `python3 -m ENTRY ARGS` would run it, stdin still open for what follows the zip.
"""

import hashlib
import importlib.abc
import importlib.util
import io
import runpy
import sys
import zipfile


class PayloadModules(importlib.abc.MetaPathFinder, importlib.abc.InspectLoader):
    """The zip's `.py` files as importable modules (packages: the `__init__.py` of a folder)."""

    def __init__(self, data, label, entry):
        self.zip = zipfile.ZipFile(io.BytesIO(data))
        self.label = label
        self.files = {}
        for name in self.zip.namelist():
            if name.endswith(".py"):
                parts = name[:-3].split("/")
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                self.files[".".join(parts)] = name
        self.names = {"__main__": self.files.get(entry)}  # the entry, as runpy runs it (tracebacks)

    def find_spec(self, fullname, path=None, target=None):
        arc = self.files.get(fullname)
        if arc is None:
            return None
        spec = importlib.util.spec_from_loader(
            fullname, self, origin=self.label + "/" + arc, is_package=self.is_package(fullname)
        )
        spec.has_location = True  # __file__ names the zip member (tracebacks, reprs)
        return spec

    def _arc(self, fullname):
        arc = self.files.get(fullname) or self.names.get(fullname)
        if arc is None:
            raise ImportError("not in the gpubox payload: %s" % fullname, name=fullname)
        return arc

    def is_package(self, fullname):
        return self._arc(fullname).endswith("/__init__.py")

    def get_source(self, fullname):
        return self.zip.read(self._arc(fullname)).decode("utf-8")

    def get_code(self, fullname):
        return compile(self.get_source(fullname), self.label + "/" + self._arc(fullname), "exec")


def main():
    stdin = sys.stdin.buffer
    entry, digest = sys.argv[1], sys.argv[2]
    nonce, need = stdin.readline().decode("ascii").split()
    want = tuple(int(x) for x in need.split("."))
    if sys.version_info[:2] < want:  # before anything runs: a copier must not copy first
        sys.stderr.write(
            "gpubox payload: %s is python %d.%d; %s needs python >= %s\n"
            % (sys.executable, sys.version_info[0], sys.version_info[1], entry, need)
        )
        sys.exit(2)
    size = int(stdin.readline())
    data = stdin.read(size)
    if len(data) != size or not hashlib.sha256(data).hexdigest().startswith(digest):
        sys.stderr.write("gpubox payload: the zip for %s arrived truncated or altered\n" % entry)
        sys.exit(2)
    sys.meta_path.insert(0, PayloadModules(data, "<gpubox payload %s>" % digest, entry))
    sys.argv = [entry] + sys.argv[3:]  # runpy puts the entry's file name in argv[0]
    # The entry's answer between two markers with this run's nonce: lines an interpreter prints
    # before it (sitecustomize) or at exit (atexit, a .pth) fall outside and are not parsed.
    # A nonce of "-" (a payload run by hand, not through payload.run) asks for no frame.
    if nonce == "-":
        runpy.run_module(entry, run_name="__main__", alter_sys=True)
        return
    out = sys.stdout
    out.write("\n<<gpubox-payload-begin %s>>\n" % nonce)
    out.flush()
    try:
        runpy.run_module(entry, run_name="__main__", alter_sys=True)
    finally:
        try:
            sys.stdout.flush()
        except Exception:
            pass
        out.write("\n<<gpubox-payload-end %s>>\n" % nonce)
        out.flush()


if __name__ == "__main__":
    main()
