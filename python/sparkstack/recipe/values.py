"""Value kinds: what a knob, a [[nodes]] key or an engine flag's value may be, checked where it enters.

A kind is a function value -> problem (None when fine). Problems read after the value:
"API_PORT='0' is not a port number (1-65535)". Patterns use [0-9], never the \\d class, which also matches other
scripts' digits.
"""

from __future__ import annotations

import ipaddress
import json
import re
import unicodedata
from collections.abc import Callable

from sparkstack.errors import SparkstackError
from sparkstack.hfcache import COMMIT
from sparkstack.text import quoted

Kind = Callable[[str], "str | None"]

# How a valid value of a kind reads, for the kinds where two spellings can stand for one value (04 and 4, 0.9 and
# 0.90): `meaning` compares values through it. The other kinds' values are their spelling.
_READS: dict[Kind, Callable[[str], object]] = {}


def reads(read: Callable[[str], object]) -> Callable[[Kind], Kind]:
    """Declare how a kind's valid values read (decorator)."""
    def declare(kind: Kind) -> Kind:
        _READS[kind] = read
        return kind
    return declare


def meaning(kind: Kind, value: str) -> object:
    """What a valid value of `kind` stands for: two values with one meaning configure the same thing."""
    return _READS.get(kind, str)(value)

INT_MAX = 2**63 - 1
# Characters no knob or recipe value may hold: controls, invisible marks, lone surrogates, private-use and
# unassigned code points, line breaks. Every category str.isprintable() refuses except the spaces (Zs), so a
# value that passes here is also one remote.Runner accepts as an ssh target (it refuses what is not printable).
_BAD_CATEGORIES = {"Cc": "control character", "Cf": "invisible format character", "Cs": "lone surrogate",
                   "Co": "private-use character", "Cn": "unassigned code point", "Zl": "line separator",
                   "Zp": "paragraph separator"}
_DECIMAL = re.compile(r"[0-9]{1,20}(\.[0-9]{1,20})?|\.[0-9]{1,20}")
_REF = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/:@-]{0,511}")  # the characters of a docker image reference
_CONTAINER = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{1,127}")  # docker's rule for container names
_WORD = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
_CACHE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}")  # one path component under the hub
_REPO = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]{0,95}/)?[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*")
_NIC = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@+-]{0,14}")  # IFNAMSIZ: 15 characters, no '/', ':' or space
_HCA = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@+-]{0,63}")
_SIZE = re.compile(r"[0-9]{1,15}(\.[0-9]{1,6})?[kKmMgGtTpP]?[iI]?[bB]?")  # docker's --shm-size units


def one_line(value: str) -> str | None:
    bad = next((c for c in value if unicodedata.category(c) in _BAD_CATEGORIES), None)
    return None if bad is None else f"holds the {_BAD_CATEGORIES[unicodedata.category(bad)]} {bad!r}"


def text(value: str, limit: int = 1024) -> str | None:
    if value == "":
        return "must not be empty"
    if value.startswith("-"):
        return "must not start with '-' (it would be read as an option)"
    if len(value) > limit:
        return f"is longer than {limit} characters"
    return one_line(value)


def token(value: str) -> str | None:
    return text(value) or ("must not hold whitespace" if any(c.isspace() for c in value) else None)


def matching(pattern: re.Pattern, what: str) -> Kind:
    return lambda value: token(value) or (None if pattern.fullmatch(value) else f"is not {what}")


def whole_number(lo: int, hi: int, what: str) -> Kind:
    @reads(int)
    def check(value: str) -> str | None:
        if not value.isascii() or not value.isdigit():
            return f"is not {what}"
        if len(value) > 19 or int(value) > hi:  # a number, only too large: say so, not "not a number"
            return f"is over the largest allowed, {hi:,}" if hi >= 10**6 else f"is not {what}"
        return None if lo <= int(value) else f"is not {what}"
    return check


def or_empty(kind: Kind) -> Kind:
    @reads(lambda value: "" if value == "" else meaning(kind, value))
    def check(value: str) -> str | None:
        return None if value == "" else kind(value)
    return check


count = whole_number(1, INT_MAX, "a whole number >= 1 (digits 0-9 only)")
byte_count = whole_number(0, INT_MAX, "a whole number of bytes (digits 0-9 only)")
node_rank = whole_number(0, 1023, "a whole number from 0 to 1023")
port = whole_number(1, 65535, "a port number (1-65535)")
word = matching(_WORD, "a plain name (letters, digits, '_', '.', '-')")
image_ref = matching(_REF, "an image reference")
cache_name = matching(_CACHE, "a cache entry name (one path component, e.g. models--ORG--NAME)")
nic = matching(_NIC, "a network interface name (at most 15 characters, no '/' or ':')")
hca = matching(_HCA, "an RDMA device name (no '/' or ':')")
shm_size = matching(_SIZE, "a size such as 16g or 32gb")
repo_id = matching(_REPO, "an HF repo id (ORG/NAME)")

UNPINNED = "unpinned"


def commit_or_unpinned(value: str) -> str | None:
    # A revision is a full commit hash (what the hub names a snapshot by), or honestly "unpinned": never a branch.
    ok = value == UNPINNED or COMMIT.fullmatch(value)
    return None if ok else f'is neither "{UNPINNED}" nor a commit hash (40 lowercase hex digits)'


@reads(float)
def fraction(value: str) -> str | None:
    ok = _DECIMAL.fullmatch(value) and 0 < float(value) <= 1
    return None if ok else "is not a fraction in (0, 1] (e.g. 0.90)"


@reads(lambda value: value == "1")  # "" and "0" both leave CUDA graphs on
def eager(value: str) -> str | None:
    return None if value in ("", "0", "1") else "is not valid: expected 0 or 1 (or empty)"


def container_name(value: str) -> str | None:
    # {rank} is the one placeholder NAME knows; the rest must satisfy docker's own rule.
    if _CONTAINER.fullmatch(value.replace("{rank}", "0")):
        return None
    return "is not a container name (letters, digits, '_', '.', '-'; {rank} for the rank)"


def host(value: str) -> str | None:
    problem = token(value)
    if problem:
        return problem
    try:
        ipaddress.ip_address(value)
        return None
    except ValueError:
        return None if _HOSTNAME.fullmatch(value) else "is not an IP address or host name"


def ssh_target(value: str) -> str | None:
    """ssh's `[user@]host`: ssh reads no port there (`user@host:22` is a host named `host:22`); a port belongs in
    ssh_config. A bare IPv6 address is the one host with colons."""
    problem = token(value)
    if problem:
        return problem
    user, _, name = value.rpartition("@")
    if value.startswith("-") or not name or (user == "" and "@" in value):
        return "is not an ssh target: expected user@host or host"
    if ":" in name:
        try:
            ipaddress.IPv6Address(name.strip("[]"))
        except ValueError:
            return (f"holds a port ({name!r}): ssh takes none in user@host; set it in an ssh_config "
                    f"(`Host {name.rsplit(':', 1)[0]}` then `Port {name.rsplit(':', 1)[1]}`) and pass --ssh-config")
    return None


def ip_address(value: str) -> str | None:
    """A unicast IPv4 or IPv6 address, as an address is written (no host name: it is read as one)."""
    try:
        ip = ipaddress.ip_address(value)
    except ValueError:
        return "is not an IPv4 or IPv6 address (a fabric address: a host name is not one)"
    if ip.is_loopback:  # ::1 sits in IPv6's reserved ::/8; whether loopback will do is the deployment's call
        return None
    if ip.is_unspecified or ip.is_multicast or ip.is_reserved:
        return "is not a unicast address"
    return None


def ipv4(value: str) -> str | None:
    try:
        ip = ipaddress.IPv4Address(value)
    except ValueError:
        return "is not an IPv4 address"
    if ip.is_unspecified or ip.is_multicast or ip.is_reserved:
        return "is not a unicast IPv4 address"
    return None


def hf_home(value: str) -> str | None:
    problem = text(value, limit=4095)
    if problem:
        return problem
    if ":" in value:  # docker -v splits on ':': "/a:/etc" would mount /a at /etc
        return "must not hold ':' (docker -v would split the path there)"
    if not (value.startswith("/") or value == "~" or value.startswith("~/")):
        return "must be an absolute path or start with ~/"
    return None


def spec_json(value: str) -> str | None:
    try:
        spec = json.loads(value)
    except (ValueError, RecursionError) as exc:
        return f"is not JSON ({str(exc)[:80]})"
    return None if isinstance(spec, dict) else "is not a JSON object"


def no_nul(value: str) -> str | None:
    return "holds a NUL byte" if "\0" in value else None


def not_a_flag(value: str) -> str | None:
    return "must not start with '-' (it would be read as an option)" if value.startswith("-") else None




def check_value(where: str, value: str, kind: Kind) -> None:
    """Raise the one line naming where the value came from, the value and what is wrong with it."""
    problem = kind(value)
    if problem:
        raise SparkstackError(f"{where}{quoted(value)} {problem}")

