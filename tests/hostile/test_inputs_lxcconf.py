"""Parser differential: gpubox's container-config parser against pve-container's parse rules.

`pve_parse` is a small executable transcription of parse_pct_config (pve-container
src/PVE/LXC/Config.pm): `split(/\\n/, $raw)` on the file's bytes, then per line `^\\s*$` skipped,
`[pve:pending]` / `[name]` headers, `#` comments, `lxc.*` keys (`:` or `=`), `description:`, other
`key: value`. It runs on bytes, as Perl does there, so \\s, \\d and [a-z]/i are ASCII. Hypothesis
draws configs with CR, CRLF, U+2028, U+0085, NUL, vertical tabs and very long lines; both parsers
must agree on every section and every (key, value), line by line. Lines holding a character
another splitter would break at are named in the planner's warnings."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpubox.provision.confedit import decide
from gpubox.provision.devices import read_host_devices
from gpubox.provision.lxcconf import LxcConf, odd_characters, split_lines
from tests.lxc_fakehost import fake_host

_BLANK = re.compile(rb"^\s*$")
_PENDING = re.compile(rb"^\[pve:pending\]\s*$", re.I)
_SNAP = re.compile(rb"^\[([a-z][a-z0-9_\-]+)\]\s*$", re.I)
_LXC = re.compile(rb"^(lxc\.[a-z0-9_\-\.]+)(:|\s*=)\s*(.*?)\s*$")
_DESCR = re.compile(rb"^(description):\s*(.*\S)\s*$")
_KEY = re.compile(rb"^([a-z][a-z_]*\d*):\s*(.+?)\s*$")


def pve_parse(raw: bytes) -> list[tuple[str, str, str]]:
    """(section, key, value) for every keyed line, in file order, as Config.pm reads them."""
    out, section = [], "main"
    for line in raw.split(b"\n"):
        if _BLANK.match(line):
            continue
        if _PENDING.match(line):
            section = "pve:pending"
            continue
        m = _SNAP.match(line)
        if m:
            section = m.group(1).decode()
            continue
        if line.startswith(b"#"):
            continue
        m = _LXC.match(line) or _DESCR.match(line) or _KEY.match(line)
        if m:
            out.append((section, m.group(1).decode(), m.group(m.lastindex).decode()))
    return out


def gpubox_parse(text: str) -> list[tuple[str, str, str]]:
    conf = LxcConf.parse(text)
    return [(s.name, l.key, l.value) for s in conf.sections for l in s.lines if l.key is not None]


PIECES = [
    "lxc.cgroup2.devices.allow: c 195:* rwm",
    "lxc.cgroup2.devices.allow = c 189:* rwm",
    "lxc.mount.entry: /dev/nvidia0 dev/nvidia0 none bind,optional,create=file",
    "dev0: /dev/nvidia0",
    "arch: amd64",
    "description: a b",
    "#comment ",
    "[pve:pending]",
    "[snap1]",
    "[\u212aelvin]",  # KELVIN SIGN: [a-z] with re.I would match it without re.ASCII
    "memory: 512",
    " ",
    "=",
    ":",
]
ODD = ["\r", "\r\n", "\u2028", "\u2029", "\x85", "\0", "\x0b", "\x0c", "\x1c", "\x1e", "\t", " ", "\xa0"]
CHUNK = st.one_of(st.sampled_from(PIECES), st.sampled_from(ODD), st.just("\n"), st.text(max_size=8))
CONF = st.lists(CHUNK, max_size=40).map("".join)
LONG = st.builds(
    lambda a, n, b: a + "x" * n + b, st.sampled_from(PIECES), st.integers(0, 200_000), st.sampled_from(ODD)
)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.one_of(CONF, st.lists(st.one_of(CONF, LONG), max_size=3).map("\n".join)))
def test_parser_reads_what_proxmox_reads(text):
    assert gpubox_parse(text) == pve_parse(text.encode())
    assert LxcConf.parse(text).render() == text


@pytest.mark.parametrize(
    "text",
    [
        "#note\u2028lxc.cgroup2.devices.allow: c 189:* rwm\n",  # a USB rule a comment swallows
        "#note\rlxc.cgroup2.devices.allow: c 195:* rwm\n",
        "#note\x85dev0: /dev/nvidia0\n",
    ],
)
def test_a_rule_after_a_separator_in_a_comment_is_comment(text):
    assert gpubox_parse(text) == pve_parse(text.encode()) == []


def test_split_lines_splits_at_newline_only():
    text = "a\rb\u2028c\x85d\x0be\r\nf\ng"
    assert split_lines(text) == ["a\rb\u2028c\x85d\x0be\r\n", "f\n", "g"]
    assert odd_characters("x: y\r\n") == []
    assert odd_characters("x\0y\n") == ["a NUL byte"]


@pytest.fixture(scope="module")
def hd(tmp_path_factory):
    return read_host_devices(fake_host(tmp_path_factory.mktemp("odd") / "pve1"), 2)


@pytest.mark.parametrize(
    "odd, name",
    [("\u2028", "U+2028"), ("\r", "carriage return"), ("\0", "NUL"), ("\x85", "U+0085")],
)
def test_review_names_odd_characters(hd, odd, name):
    text = f"arch: amd64\n#note{odd}lxc.cgroup2.devices.allow: c 189:* rwm\nmemory: 512\n"
    rev = decide(LxcConf.parse(text), hd)
    named = [w for w in rev.warnings if name in w]
    assert named and "line 2" in named[0], rev.warnings
    assert "lxc.cgroup2.devices.allow: c 189:* rwm" in rev.new  # the line itself is left as it is


def test_crlf_ending_alone_is_not_named(hd):
    rev = decide(LxcConf.parse("arch: amd64\r\nmemory: 512\r\n"), hd)
    assert not [w for w in rev.warnings if "carriage return" in w]
