"""Redaction of a diagnostics bundle: hostnames, IP and MAC addresses, serial numbers, WWNs,
loop devices' backing files, boot ids, the agent's address, filesystem UUIDs, partition
UUIDs, filesystem and partition labels and mountpoints other than the standard ones.

Pure: text in, text out. ``Redactor.redact(bundle)`` makes two passes over
every text file, the file paths and the manifest data:

1. detect: the values the caller seeds (the topology's hostname, serials,
   WWNs, FC port names and loop devices' backing files are seeded from
   ``topology.json``) plus what the detectors find: values under keys such as
   ``serial_number``, ``SN``, ``SAS Address``, ``Host Name``, ``boot_id`` or
   ``back-file``, smartctl's WWN object, NFS/CIFS servers in mountinfo, FQDNs of known
   hosts, and forms that name themselves
   (naa./eui. ids, 0x5.../0x21..., colon-separated and multipath wwids, bare WWNs after a
   word naming them such as ``nn``, ``pn`` or ``Path``, IPv4, IPv6, MACs); a bare run of
   hex digits is not a WWN by itself: the topology hash and other digests stay;
   filesystem ids under lsblk/blkid keys (``uuid``, ``partuuid``, ``label``, ``mountpoint``,
   ``UUID="..."``), in ``/dev/disk/by-*`` links, the kernel's "mounted filesystem <uuid>"
   and the mountpoints of mountinfo;
2. replace: one regular expression per text, so a value becomes the same
   token in every file, the longest known value wins over its substrings, and
   a token is never read again (redacting twice changes nothing). Only a whole value that
   *is* a token is taken for one: ``/srv/HOST-2024/acme.img`` is a path to mask.

A value's token is keyed by a canonical form: ``naa.5000c500a1b2c3d4``,
``0x5000C500A1B2C3D4`` and the multipath wwid ``35000c500a1b2c3d4`` are all
WWN-0001, and their prefixes stay (``naa.WWN-0001``, ``0xWWN-0001``,
``3WWN-0001``) so support still sees what kind of id it was.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import suppress
from typing import Final, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from stortune.schemas.bundle import Bundle, BundleInfo, MaskedKind, RedactionSummary
from stortune.schemas.topology import Topology

Kind = Literal["hostname", "ip", "mac", "serial", "wwn", "path", "bootid", "address",
               "uuid", "partuuid", "label", "mountpoint"]
KINDS: tuple[Kind, ...] = ("hostname", "ip", "mac", "serial", "wwn", "path", "bootid", "address",
                           "uuid", "partuuid", "label", "mountpoint")
_TOKEN_PREFIX: dict[Kind, str] = {
    "hostname": "HOST", "ip": "IP", "mac": "MAC", "serial": "SERIAL", "wwn": "WWN",
    # a loop device's backing file names a user, a project, a customer; a boot id and the
    # agent's HOST:PORT single out one machine as surely as its hostname
    "path": "PATH", "bootid": "BOOT", "address": "ADDR",
    # a filesystem's or partition's UUID is unique to one disk; labels and mountpoints name
    # customers and projects (/srv/acme, "acme-data")
    "uuid": "UUID", "partuuid": "PARTUUID", "label": "LABEL", "mountpoint": "MNT",
}
#: What a token starts with; longest first so that PARTUUID is not read as something shorter.
TOKEN_PREFIXES: tuple[str, ...] = tuple(sorted(_TOKEN_PREFIX.values(), key=len, reverse=True))
TOKEN = re.compile(rf"(?:{'|'.join(TOKEN_PREFIXES)})-\d{{4,}}(?!\d)")
MAP_FORMAT: Final = "stortune-redaction-map/1"
TOPOLOGY_FILE = "topology.json"


class RedactionMapping(BaseModel):
    """Token -> original value, by kind. Stays with the customer (the control plane)."""

    model_config = ConfigDict(extra="forbid")

    format: Literal["stortune-redaction-map/1"] = MAP_FORMAT
    values: dict[Kind, dict[str, str]] = Field(default_factory=dict)

    def original(self, token: str) -> str | None:
        for tokens in self.values.values():
            if token in tokens:
                return tokens[token]
        return None


# -- canonical forms ----------------------------------------------------------

_HEXRUN = re.compile(r"[0-9a-f]+")
_HOSTNAME = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,62})(?:\.[a-z0-9-]{1,63})*")
_NOT_HOSTS = frozenset({"localhost", "localhost.localdomain", "(none)", "unknown", "none"})
_BOOT_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
#: Longer is no backing file or address anyone types; a bound keeps the one regex small.
_LITERAL_MAX = 4096


def wwn_core(value: str) -> str | None:
    """The 16 or 32 hex digits of a WWN in any usual spelling, lower case; None if it is not one."""
    v = value.strip().lower()
    for prefix in ("naa.", "eui.", "0x"):
        if v.startswith(prefix):
            v = v[len(prefix):]
            break
    v = re.sub(r"[\s:-]", "", v)
    if len(v) in (17, 33) and v.startswith("3"):  # a SCSI page-83 wwid as multipathd prints it
        v = v[1:]
    if len(v) in (16, 32) and _HEXRUN.fullmatch(v) and v.strip("0"):
        return v
    return None


def _plausible_serial(value: str) -> bool:
    """At least 8 characters, or 4 with both letters and digits: masking a virtio serial
    like 'data' or '1' would mask that word or number everywhere."""
    mixed = any(c.isdigit() for c in value) and any(c.isalpha() for c in value)
    return len(value) >= 8 or (len(value) >= 4 and mixed)


def _ip(value: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        addr = ipaddress.ip_address(value.strip().strip("[]").split("%")[0])
    except ValueError:
        return None
    return None if addr.is_loopback or addr.is_unspecified else addr


# -- filesystem identifiers -----------------------------------------------------------

_MD_UUID = re.compile(r"[0-9a-f]{8}(?::[0-9a-f]{8}){3}")  # mdadm's spelling of an array's UUID
# vfat/exfat volume ids, NTFS serials, LVM2 PV/VG ids: under a uuid key only
_OTHER_FS_UUID = re.compile(r"[0-9a-f]{4}-[0-9a-f]{4}|[0-9a-f]{16}"
                            r"|[0-9a-z]{6}(?:-[0-9a-z]{4}){5}-[0-9a-z]{6}")
_DOS_PARTUUID = re.compile(r"[0-9a-f]{8}(?:-[0-9a-f]{2})?")  # an MBR disk id, and its partitions'
#: Labels partitioning and imaging tools give by default: they name no customer.
_COMMON_LABELS = frozenset({
    "root", "rootfs", "boot", "efi", "esp", "uefi", "efi system partition", "efi-system", "swap",
    "home", "var", "tmp", "data", "system", "recovery", "primary", "logical", "extended",
    "cloudimg-rootfs", "img-rootfs", "config-2", "cidata", "linux filesystem", "linux swap",
    "bios boot partition", "basic data partition", "microsoft reserved partition"})
#: Mountpoints of the FHS and of the kernel's own filesystems: they say nothing of the customer.
# (S108: names to keep, not files to open)
_STANDARD_MOUNTS = frozenset({
    "/", "/boot", "/boot/efi", "/efi", "/home", "/root", "/var", "/var/log", "/var/tmp",  # noqa: S108
    "/var/lib", "/var/cache", "/var/spool", "/tmp", "/usr", "/usr/local", "/opt", "/srv",  # noqa: S108
    "/mnt", "/media", "/run", "/run/lock", "/dev", "/dev/shm", "/dev/pts", "/dev/mqueue",  # noqa: S108
    "/dev/hugepages", "/proc", "/sys"})


def _uuid_key(value: str) -> str | None:
    """The 32 hex digits of an RFC 4122 or mdadm-spelled UUID, lower case; None otherwise or nil."""
    v = value.lower()
    if not (_BOOT_ID.fullmatch(v) or _MD_UUID.fullmatch(v)):
        return None
    key = re.sub(r"[-:]", "", v)
    return key if key.strip("0") else None  # the nil UUID (no UUID at all) identifies nothing


def _unescape(value: str) -> str:
    """mountinfo's octal (``\\040``) and udev's hex (``\\x20``) escapes undone."""
    value = re.sub(r"\\([0-3][0-7]{2})", lambda m: chr(int(m[1], 8)), value)
    return re.sub(r"\\x([0-9a-fA-F]{2})", lambda m: chr(int(m[1], 16)), value)


def _octal(text: str) -> str:
    """As mountinfo prints a path: space, tab, newline and backslash octal-escaped."""
    return "".join(f"\\{ord(c):03o}" if c in " \t\n\\" else c for c in text)


def _udev(text: str) -> str:
    """As udev names a /dev/disk/by-label link: what is not plain ASCII or UTF-8 as \\xNN."""
    return "".join(c if not c.isascii() or c.isalnum() or c in "#+-.:=@_"
                   else "".join(f"\\x{b:02x}" for b in c.encode()) for c in text)


def _spellings(text: str) -> set[str]:
    """A name as the tools print it: raw, JSON-escaped (both ways), mountinfo- and udev-escaped."""
    return {text, json.dumps(text)[1:-1], json.dumps(text, ensure_ascii=False)[1:-1], _octal(text),
            _udev(text), _octal(_udev(text))}


# -- patterns -------------------------------------------------------------------

_H = "[0-9A-Fa-f]"
_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
_IPV4 = rf"{_OCTET}(?:\.{_OCTET}){{3}}"
# Self-identifying forms, in the order they are tried at one position.
_GENERIC: tuple[tuple[str, str], ...] = (
    # smartctl -j prints an ATA/SCSI WWN as three integers
    ("wwnobj", r'"wwn"\s*:\s*\{\s*"naa"\s*:\s*(?P<naa>\d{1,2})\s*,\s*"oui"\s*:\s*(?P<oui>\d{1,9})\s*,'
               r'\s*"id"\s*:\s*(?P<wid>\d{1,12})\s*\}'),
    ("mac", rf"(?<![0-9A-Za-z:.-]){_H}{{2}}(?P<sep>[:-])(?:{_H}{{2}}(?P=sep)){{4}}{_H}{{2}}"
            r"(?![0-9A-Za-z:-]|\.[0-9A-Za-z])"),
    ("wwnid", rf"(?<![0-9A-Za-z.])(?i:naa|eui)\.(?P<idcore>{_H}{{32}}|{_H}{{16}})(?![0-9A-Za-z])"),
    # 0x-prefixed WWNs (NAA 5/6 LUNs, NAA 1/2 FC ports) and multipath wwids (3 + NAA 5/6);
    # a hex letter is required so that a long decimal counter is never taken for one
    ("wwnhex", rf"(?<![0-9A-Za-z])(?:0[xX](?=\d*[A-Fa-f])(?P<xcore>[1256]{_H}{{15}}|6{_H}{{31}})"
               rf"|3(?=\d*[A-Fa-f])(?P<mcore>5{_H}{{15}}|6{_H}{{31}}))(?![0-9A-Za-z])"),
    # bare, as storcli prints WWNs and SAS addresses and qla2xxx its nn/pn: NAA 1/2/5 or 6; a WWN
    # only where a word before it names one (_WWN_LABEL): bare hex is as often a digest
    ("wwnbare", rf"(?<![0-9A-Za-z])(?=\d*[A-Fa-f])(?P<bcore>[125]{_H}{{15}}|6{_H}{{31}})(?![0-9A-Za-z])"),
    ("wwncolon", rf"(?<![0-9A-Za-z:])(?=[125])(?:{_H}{{2}}:){{7}}{_H}{{2}}(?![0-9A-Za-z:])"),
    # four octets of at most 255 without leading zeros, not inside a longer dotted version
    ("ipv4", rf"(?<![0-9A-Za-z.]){_IPV4}(?![0-9A-Za-z]|\.\d)"),
    ("ipv6", rf"(?<![0-9A-Za-z:.])(?=[0-9A-Fa-f:]*::|(?:{_H}{{1,4}}:){{7}})"
             rf"(?:(?:{_H}{{0,4}}:){{2,6}}{_IPV4}|{_H}{{0,4}}(?::{_H}{{0,4}}){{2,7}})"
             r"(?:%[0-9A-Za-z]+)?(?![0-9A-Za-z:]|\.\d)"),
)
# The words tools print before a bare WWN: qla2xxx's "nn"/"pn", megaraid_sas's "Path", storcli's
# "SAS Address", sysfs and FC tools' node/port names. Without one, 16 or 32 hex digits are no more a
# WWN than the topology hash or any other digest is.
_WWN_LABEL = re.compile(r"(?i:\b(?:wwnn|wwpn|wwn|wwid|nn|pn|node[ _]?name|port[ _]?name"
                        r"|sas[ _]?address(?:\(\d+\))?|sas[ _]?addr|path))[\s:=(\[\"']{1,4}$")


def _named_as_wwn(text: str, start: int) -> bool:
    """Whether a word naming a WWN directly precedes ``text[start:]``."""
    return _WWN_LABEL.search(text, max(0, start - 40), start) is not None


# Every generic form starts with one of these: testing it first skips most positions cheaply.
_GENERIC_FIRST = '0-9A-Fa-f:"nN'
_GENERIC_RE = re.compile(f"(?=[{_GENERIC_FIRST}])(?:"
                         + "|".join(f"(?P<{name}>{pattern})" for name, pattern in _GENERIC) + ")")

# a JSON string value with its escapes (a label "acme \"prod\"", a mountpoint in \u00e9)
_JSON_PAIR = re.compile(r'"(?P<k>[A-Za-z][A-Za-z0-9 _()./-]{0,48})"\s*:\s*"(?P<v>(?:[^"\\\r\n]|\\.){1,256})"')
# lsblk -O lists every mountpoint of a device
_JSON_LIST = re.compile(r'"(?P<k>mountpoints)"\s*:\s*\[(?P<items>[^\]]{0,8192})\]')
_JSON_STRING = re.compile(r'"(?P<v>(?:[^"\\\r\n]|\\.){1,4096})"')
# blkid's LABEL="..." UUID="..." and the unquoted UUID=... of blkid -o export, fstab, a command line
_ASSIGN = re.compile(r'(?<![A-Za-z0-9_])(?P<k>(?i:PARTUUID|PTUUID|UUID_SUB|UUID|PARTLABEL|LABEL))='
                     r'(?:"(?P<q>(?:[^"\\\r\n]|\\.){1,256})"|(?P<v>[^\s"]{1,256}))')
# what names a filesystem in a link or a kernel message: /dev/disk/by-label/acme\x20data,
# "EXT4-fs (vda1): mounted filesystem <uuid>", XFS' "Mounting V5 Filesystem <uuid>",
# btrfs' "device fsid <uuid>" and "device label <label> devid"
_BY_LINK = re.compile(r"/dev/disk/by-(?P<by>uuid|partuuid|label|partlabel)/(?P<v>[^\s\"',;]{1,256})")
_FS_MESSAGE = re.compile(r"(?i:\b(?:file ?system|fsid)) "
                         r"(?P<uuid>[0-9A-Fa-f]{8}(?:-[0-9A-Fa-f]{4}){3}-[0-9A-Fa-f]{12})(?![0-9A-Za-z])"
                         r"|\bdevice label (?P<label>\S[^\r\n]{0,254}?) devid \d")
_MOUNTINFO = re.compile(r"^\d+ \d+ \d+:\d+ \S+ (?P<mnt>/\S*) ", re.M)
_TEXT_PAIR = re.compile(
    r"^[ \t]*(?P<k>[A-Za-z][A-Za-z0-9 _()./-]{0,48}?)[ \t]*[:=][ \t]*(?P<v>[^\r\n]*?)[ \t]*$", re.M)
_NETFS = re.compile(r" - (?:nfs4?|cifs|smb3|smbfs|glusterfs|ceph|9p) (?P<src>\S+)")
_SERIAL_KEYS = frozenset({"serial", "sn", "serialno", "serialnum"})
_WWN_KEYS = frozenset({"wwn", "wwid", "wwnn", "wwpn", "portname", "luwwndeviceid", "logicalunitid"})
_PATH_KEYS = frozenset({"backfile", "backingfile"})  # lsblk/losetup's BACK-FILE, sysfs' backing_file
# lsblk's and blkid's names (and udev's) for filesystem and partition ids
_FS_KEYS: dict[str, Kind] = {
    "uuid": "uuid", "fsuuid": "uuid", "uuidsub": "uuid", "idfsuuid": "uuid",
    "partuuid": "partuuid", "ptuuid": "partuuid",
    "idpartentryuuid": "partuuid", "idparttableuuid": "partuuid",
    "label": "label", "partlabel": "label", "fslabel": "label",
    "mountpoint": "mountpoint", "mountpoints": "mountpoint",
}
_BY_KIND: dict[str, Kind] = {"uuid": "uuid", "partuuid": "partuuid", "label": "label", "partlabel": "label"}
_WWN_WORDS = ("wwn", "wwpn", "wwid")


def _key_kind(key: str, value: str) -> Kind | None:
    """What a value is, judged by the key it is printed under (JSON or 'Key: value' text)."""
    k = re.sub(r"[^a-z0-9]", "", key.lower())
    if k == "bootid":
        return "bootid"
    if k in _PATH_KEYS:
        return "path"
    if k in _FS_KEYS:
        return _FS_KEYS[k]
    if k in _SERIAL_KEYS or k.endswith("serialnumber"):
        return "serial"
    # "Port WWN", "fc_wwpn", "Logical Unit WWN Device Identifier" name one too; the value is masked
    # only when it has a WWN's shape (_canonical), so a key's other words cannot widen that.
    if k in _WWN_KEYS or k.startswith("sasaddress") or any(w in k for w in _WWN_WORDS):
        return "wwn"
    if k in ("hostname", "nodename"):  # an FC node_name is a WWN, uname's nodename a host
        return "wwn" if wwn_core(value) else "hostname"
    return None


_Trie: TypeAlias = dict[str, "_Trie"]


#: Groups a literal trie may nest: the regex compiler and emit() recurse once per level.
_TRIE_DEPTH = 64


def _chain(node: _Trie) -> tuple[str, _Trie]:
    """The characters of a run of single-child nodes, and the node where it branches or ends."""
    run = []
    while len(node) == 1 and "" not in node:
        ((ch, node),) = node.items()
        run.append(ch)
    return "".join(run), node


def _nesting(root: _Trie) -> int:
    """How deep the groups of ``root``'s pattern nest: one level per branch or end of a word."""
    deepest, stack = 0, [(root, 0)]
    while stack:
        node, depth = stack.pop()
        _, node = _chain(node)
        deepest = max(deepest, depth + 1)
        stack += [(child, depth + 1) for ch, child in node.items() if ch]
    return deepest


def _trie_pattern(words: Iterable[str]) -> str:
    """One regex for many literals that costs one character test per level, not one per word.

    An optional tail is greedy, so the longest literal is tried first and a
    shorter one only when the longer cannot match (or fails its boundary). Runs
    without a branch are one string, so a 4096-character path is one level, not 4096.
    """
    words = list(words)
    root: _Trie = {}
    for word in words:
        node = root
        for ch in word:
            node = node.setdefault(ch, {})
        node[""] = {}
    if _nesting(root) > _TRIE_DEPTH:
        # values each a prefix of the next, nested deeper than the compiler goes: one flat
        # alternation, longest first, slower per position but the same matches
        return "(?:" + "|".join(re.escape(w) for w in sorted(set(words), key=len, reverse=True)) + ")"

    def emit(node: _Trie) -> str:
        run, node = _chain(node)
        branches = [re.escape(ch) + emit(child) for ch, child in sorted(node.items()) if ch]
        if not branches:
            return re.escape(run)
        body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        return re.escape(run) + (f"(?:{body})?" if "" in node else body)

    return emit(root)


def _continues_dotted(text: str, end: int) -> bool:
    """'vm' in 'vm.dirty_ratio' is a sysctl, not the host: a known FQDN is matched whole instead."""
    return end + 1 < len(text) and text[end] == "." and (text[end + 1].isalnum() or text[end + 1] == "_")


def _json_string(escaped: str) -> str:
    """A JSON string's value from its text between the quotes (the text itself if it is not one)."""
    try:
        value = json.loads(f'"{escaped}"')
    except ValueError:
        return escaped
    return value if isinstance(value, str) else escaped


def _strings(node: object) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [s for value in node.values() for s in _strings(value)]
    if isinstance(node, list):
        return [s for value in node for s in _strings(value)]
    return []


def _map_strings(node: object, fn: Callable[[str], str]) -> object:
    if isinstance(node, str):
        return fn(node)
    if isinstance(node, dict):
        return {key: _map_strings(value, fn) for key, value in node.items()}
    if isinstance(node, list):
        return [_map_strings(value, fn) for value in node]
    return node


# -- the redactor -----------------------------------------------------------------


class Redactor:
    """Consistent tokens for sensitive values across every text it is given.

    Seed it with known values (``add``, ``add_topology``), then ``redact`` a
    bundle; ``mapping`` holds token -> original. Passing an earlier mapping
    keeps its tokens, so bundles of one host taken a month apart agree.
    """

    def __init__(self, mapping: RedactionMapping | None = None) -> None:
        self._tokens: dict[tuple[Kind, str], str] = {}
        self._originals: dict[Kind, dict[str, str]] = {kind: {} for kind in KINDS}
        self._next: dict[Kind, int] = dict.fromkeys(KINDS, 1)
        self._literals: dict[str, tuple[Kind, str]] = {}  # lower-cased text -> (kind, key)
        self._bounded: set[str] = set()  # literals matched only as whole words
        self._hosts: set[str] = set()
        self._pattern: re.Pattern[str] | None = None
        self._fqdn: re.Pattern[str] | None = None
        self._used: dict[Kind, set[str]] = {kind: set() for kind in KINDS}
        self._occurrences: Counter[Kind] = Counter()
        # every token first: a known FQDN's literal forms add its short name, which must find its own
        preloaded = [self._preload(kind, token, original)
                     for kind, tokens in (mapping.values if mapping else {}).items()
                     for token, original in tokens.items()]
        for kind, key, original in filter(None, preloaded):
            self._literal_forms(kind, key, original)

    # -- seeding ------------------------------------------------------------------
    def add(self, kind: Kind, value: str) -> str | None:
        """Register a sensitive value; its token, or None when it cannot be masked as that kind."""
        found = self._canonical(kind, value)
        if found is None:
            return None
        kind, key, original = found
        token = self._token(kind, key, original)
        self._literal_forms(kind, key, original)
        return token

    def add_topology(self, topo: Topology) -> None:
        """Everything identifying a discovered topology holds."""
        if topo.hostname:
            self.add("hostname", topo.hostname)
        for dev in topo.devices:
            if dev.serial:
                self.add("serial", dev.serial)
            if dev.wwn:
                self.add("wwn", dev.wwn)
            prefix, _, value = dev.id.partition(":")
            value = re.sub(r"-part\d+$", "", value)
            if prefix in ("wwn", "serial"):
                self.add("wwn" if prefix == "wwn" else "serial", value)
            if dev.dm is not None and dev.dm.type == "multipath" and dev.dm.uuid:
                self.add("wwn", dev.dm.uuid.removeprefix("mpath-"))
            if dev.scsi_host is not None and dev.scsi_host.fc_port_name:
                self.add("wwn", dev.scsi_host.fc_port_name)
            if prefix == "loop":  # discovery names a loop device by its backing file
                self.add("path", dev.id.partition(":")[2])

    @property
    def mapping(self) -> RedactionMapping:
        return RedactionMapping(values={k: dict(v) for k, v in self._originals.items() if v})

    # -- redacting ----------------------------------------------------------------
    def redact_text(self, text: str) -> str:
        self._detect([text])
        return self._replace(text)

    def redact(self, bundle: Bundle) -> Bundle:
        """A redacted copy of ``bundle`` with the summary in its manifest data."""
        texts: dict[str, str] = {}
        binary: list[str] = []
        for path, data in sorted(bundle.files.items()):
            try:
                texts[path] = data.decode("utf-8")
            except UnicodeDecodeError:
                binary.append(path)
        topo = texts.get(TOPOLOGY_FILE)
        if topo is not None:
            # one that is not a Topology is not ours to judge; the detectors still read it
            with suppress(ValidationError):
                self.add_topology(Topology.model_validate_json(topo))
        # the manifest data string by string: in its JSON text "\ndb01" would hide a host name
        info = bundle.info.model_copy(update={"redaction": None}).model_dump(mode="json")
        self._used = {kind: set() for kind in KINDS}
        self._occurrences = Counter()
        self._detect([*_strings(info), *texts.values(), *bundle.files])
        out = Bundle(info=BundleInfo.model_validate(_map_strings(info, self._replace)))
        for path, data in sorted(bundle.files.items()):
            new_path = self._replace(path)
            if new_path in out.files:
                raise ValueError(f"redacting paths made {path!r} collide with another file")
            out.put(new_path, self._replace(texts[path]) if path in texts else data)
        out.info.redaction = RedactionSummary(
            kinds=list(KINDS),
            masked={kind: MaskedKind(values=len(self._used[kind]), occurrences=self._occurrences[kind])
                    for kind in KINDS if self._used[kind]},
            not_redacted=[self._replace(p) for p in binary],
        )
        return out

    # -- pass 1: detection ------------------------------------------------------------
    def _detect(self, texts: list[str]) -> None:
        for text in texts:
            for m in _GENERIC_RE.finditer(text):
                hit = self._generic(m)
                if hit is not None:
                    self.add(hit[0], hit[2])
            for key, value in self._pairs(text):
                kind = _key_kind(key, value)
                if kind is not None:
                    self.add(kind, value)
            for m in _NETFS.finditer(text):
                self._netfs(m["src"])
            self._filesystems(text)
        # FQDNs of known hosts last, when every host is known
        for text in texts:
            fqdn = self._fqdn_pattern()
            if fqdn is not None:
                for m in fqdn.finditer(text):
                    self.add("hostname", m.group())

    @staticmethod
    def _pairs(text: str) -> Iterator[tuple[str, str]]:
        """(key, value) as JSON, ``Key: value`` text and blkid's ``KEY="value"`` print them."""
        for m in _JSON_PAIR.finditer(text):
            yield m["k"], _json_string(m["v"])
        for m in _JSON_LIST.finditer(text):
            for item in _JSON_STRING.finditer(m["items"]):
                yield m["k"], _json_string(item["v"])
        for m in _TEXT_PAIR.finditer(text):
            yield m["k"], m["v"]
        for m in _ASSIGN.finditer(text):
            yield m["k"], re.sub(r"\\(.)", r"\1", m["q"]) if m["q"] is not None else m["v"]

    def _filesystems(self, text: str) -> None:
        """Filesystem ids in /dev/disk/by-* links and kernel messages; mountinfo's mountpoints."""
        for m in _BY_LINK.finditer(text):
            self.add(_BY_KIND[m["by"]], _unescape(m["v"]))
        for m in _FS_MESSAGE.finditer(text):
            if m["uuid"]:
                self.add("uuid", m["uuid"])
            else:
                self.add("label", m["label"])
        for m in _MOUNTINFO.finditer(text):
            self.add("mountpoint", _unescape(m["mnt"]))

    def _netfs(self, source: str) -> None:
        """The server of an NFS (host:/path) or CIFS (//host/share) mount."""
        if source.startswith("//"):
            host = source[2:].split("/", 1)[0]
        elif ":/" in source and "," not in source:
            host = source.split(":/", 1)[0]
        else:
            return
        self.add("hostname", host)

    def _fqdn_pattern(self) -> re.Pattern[str] | None:
        if self._fqdn is None and self._hosts:
            names = "|".join(re.escape(h) for h in sorted(self._hosts, key=len, reverse=True))
            self._fqdn = re.compile(
                rf"(?<![A-Za-z0-9.-])(?i:{names})(?:\.[A-Za-z0-9][A-Za-z0-9-]{{0,62}}){{2,}}"
                r"(?![A-Za-z0-9_-]|\.[A-Za-z0-9])")
        return self._fqdn

    # -- pass 2: replacement ------------------------------------------------------------
    def _replace(self, text: str) -> str:
        pattern, out, pos = self._compiled(), [], 0
        while (m := pattern.search(text, pos)) is not None:
            start, end = m.span()
            token = TOKEN.match(text, start) if m.lastgroup in ("long", "short") else None
            if token is not None and token.end() >= end:
                # a known value no longer than the token it starts (host "boot", BOOT-0001): the
                # token stays whole, so redacting twice changes nothing; a longer one (a label
                # "HOST-2024 acme") is that value, and masked
                out += [text[pos:start], token.group()]
                pos = token.end()
            else:
                out += [text[pos:start], self._substitute(m)]
                pos = max(end, start + 1)
        out.append(text[pos:])
        return "".join(out)

    def _compiled(self) -> re.Pattern[str]:
        if self._pattern is None:
            long_ = [w for w in self._literals if w not in self._bounded]
            # known values before tokens: a value may start with a token-shaped part
            alts = [f"(?P<wwnobj>{_GENERIC[0][1]})"]
            if long_:
                alts.append(f"(?P<long>(?i:{_trie_pattern(long_)}))")
            if self._bounded:
                alts.append(f"(?P<short>(?<![A-Za-z0-9])(?i:{_trie_pattern(self._bounded)})(?![A-Za-z0-9]))")
            alts.append(f"(?P<token>{TOKEN.pattern})")
            alts += [f"(?P<{name}>{pattern})" for name, pattern in _GENERIC[1:]]
            first = {c for w in self._literals for c in (w[0].lower(), w[0].upper())}
            firsts = "".join(sorted({p[0] for p in TOKEN_PREFIXES}))
            starts = _GENERIC_FIRST + firsts + re.escape("".join(sorted(first)))
            self._pattern = re.compile(f"(?=[{starts}])(?:{'|'.join(alts)})")
        return self._pattern

    def _substitute(self, m: re.Match[str]) -> str:
        text = m.group()
        alt = m.lastgroup
        if alt == "token":
            return text
        if alt in ("long", "short"):
            kind, key = self._literals[text.lower()]
            if kind == "hostname" and _continues_dotted(m.string, m.end()):
                return text
            token = self._use(kind, key)
            # a masked mountpoint stays an absolute path (/MNT-0001), as the topology wants one
            return f"/{token}" if kind == "mountpoint" else token
        hit = self._generic(m)
        if hit is None:
            return text
        kind, key, original, prefix = hit
        token = self._use(kind, key, original)
        return f'"wwn": "{token}"' if alt == "wwnobj" else prefix + token

    def _generic(self, m: re.Match[str]) -> tuple[Kind, str, str, str] | None:
        """(kind, key, original, prefix to keep) of a self-identifying match, or None."""
        text, alt = m.group(), m.lastgroup
        if alt == "wwnobj":
            core = f"{int(m['naa']):x}{int(m['oui']):06x}{int(m['wid']):09x}"
            return ("wwn", core, core, "") if len(core) == 16 else None
        if alt == "mac":
            key = re.sub(r"[^0-9a-f]", "", text.lower())
            return None if key in ("000000000000", "ffffffffffff") else ("mac", key, text, "")
        if alt == "wwnbare" and not _named_as_wwn(m.string, m.start()):
            return None
        if alt in ("wwnid", "wwnhex", "wwnbare"):
            core = m["idcore"] or m["xcore"] or m["mcore"] or m["bcore"]
            return "wwn", core.lower(), core, text[: len(text) - len(core)]
        if alt == "wwncolon":
            return "wwn", text.replace(":", "").lower(), text, ""
        if alt in ("ipv4", "ipv6"):
            addr = _ip(text)
            return None if addr is None else ("ip", str(addr), text, "")
        return None

    # -- tokens -------------------------------------------------------------------------
    def _canonical(self, kind: Kind, value: str) -> tuple[Kind, str, str] | None:
        """(kind, key, original): the key is what makes two spellings one value."""
        value = value.strip()
        # only a value that is a token was masked before: one that merely holds a token-shaped
        # part (/srv/HOST-2024/acme.img) is a value like any other
        if not value or TOKEN.fullmatch(value):
            return None
        if kind == "hostname":
            if _ip(value) is not None:
                return self._canonical("ip", value)
            host = value.rstrip(".").lower()
            if host in _NOT_HOSTS or not _HOSTNAME.fullmatch(host) or host.isdigit():
                return None
            return "hostname", host, value.rstrip(".")
        if kind == "ip":
            addr = _ip(value)
            return None if addr is None else ("ip", str(addr), value)
        if kind == "mac":
            key = re.sub(r"[^0-9a-f]", "", value.lower())
            return ("mac", key, value) if len(key) == 12 else None
        if kind == "serial":
            serial = " ".join(value.split())
            return ("serial", serial.upper(), serial) if _plausible_serial(serial) else None
        if kind == "bootid":
            key = value.lower()
            return ("bootid", key, value) if _BOOT_ID.fullmatch(key) else None
        if kind in ("uuid", "partuuid", "label", "mountpoint"):
            return self._filesystem(kind, value)
        if kind in ("path", "address"):
            # a path: absolute and more than "/"; an address: HOST:PORT, loopback ones too
            plain = value.isprintable() and len(value) <= _LITERAL_MAX
            shaped = len(value) > 1 and value.startswith("/") if kind == "path" else ":" in value
            return (kind, value, value) if plain and shaped else None
        core = wwn_core(value)
        return None if core is None else ("wwn", core, core)

    @staticmethod
    def _filesystem(kind: Kind, value: str) -> tuple[Kind, str, str] | None:
        """A filesystem or partition UUID keyed by its hex digits (mdadm's 8:8:8:8 and lsblk's
        dashes are one array), a label by its lower case, a mountpoint as it is; standard ones,
        tools' default labels, labels under 3 characters and the nil UUID stay."""
        if not value.isprintable() or len(value) > _LITERAL_MAX:
            return None
        low = value.lower()
        if kind in ("uuid", "partuuid"):
            key = _uuid_key(low)
            other = _OTHER_FS_UUID if kind == "uuid" else _DOS_PARTUUID
            if key is None and other.fullmatch(low) and low.strip("0-"):
                key = low
            return None if key is None else (kind, key, value)
        if kind == "label":
            return None if len(value) < 3 or low in _COMMON_LABELS else ("label", low, value)
        path = value.rstrip("/") or "/"
        parent, _, last = path.rpartition("/")
        # /MNT-0001 is a masked mountpoint; /HOST-0001 or /var/HOST-0001 a standard one whose name
        # is also a host's: both read so only once redacted
        redacted = TOKEN.fullmatch(last) is not None and (parent or "/") in _STANDARD_MOUNTS
        standard = path in _STANDARD_MOUNTS or path.startswith(("/proc/", "/sys/"))
        return None if standard or redacted or not path.startswith("/") else ("mountpoint", path, path)

    def _literal_forms(self, kind: Kind, key: str, original: str) -> None:
        """The spellings of a value to find in text that no pattern would recognise."""
        forms: list[tuple[str, bool]] = []  # (text, matched only as a whole word)
        if kind == "hostname":
            forms.append((key, True))
            if "." in key:  # the short name of a known FQDN is this host too
                self.add("hostname", key.split(".", 1)[0])
            self._hosts.add(key)
            self._fqdn = None
        elif kind == "serial":
            # long letter-and-digit serials are found inside by-id names and NVMe NQNs too;
            # others only as whole words, so an all-digit one is never part of a counter
            mixed = any(c.isdigit() for c in original) and any(c.isalpha() for c in original)
            bounded = len(original) < 8 or not mixed
            forms += [(original, bounded), (original.replace(" ", "_"), bounded)]
            if len(original) >= 8:  # NVMe wwids without an EUI carry the serial hex-encoded
                forms.append((original.encode().hex(), False))
        elif kind in ("path", "label", "mountpoint"):
            forms += [(form, True) for form in sorted(_spellings(original))]
        elif kind in ("bootid", "address"):
            forms.append((original, True))
        elif kind in ("uuid", "partuuid") and len(key) == 32:
            dashed = "-".join(key[a:b] for a, b in ((0, 8), (8, 12), (12, 16), (16, 20), (20, 32)))
            forms += [(dashed, False), (key, False)]  # a LUKS dm uuid holds it without dashes
            if kind == "uuid":
                forms.append((":".join(key[i:i + 8] for i in range(0, 32, 8)), False))  # mdadm
        elif kind in ("uuid", "partuuid"):
            forms.append((original, True))
        elif kind == "wwn":
            forms.append((key, False))
            if len(key) == 16:
                forms.append((":".join(key[i:i + 2] for i in range(0, 16, 2)), False))
                forms.append((f"{key[0]} {key[1:7]} {key[7:]}", False))  # smartctl's LU WWN text
        for text, bounded in forms:
            low = text.lower()
            if low not in self._literals:
                self._literals[low] = (kind, key)
                if bounded:
                    self._bounded.add(low)
                self._pattern = None

    def _token(self, kind: Kind, key: str, original: str) -> str:
        token = self._tokens.get((kind, key))
        if token is None:
            token = f"{_TOKEN_PREFIX[kind]}-{self._next[kind]:04d}"
            self._next[kind] += 1
            self._tokens[kind, key] = token
            self._originals[kind][token] = original
        return token

    def _use(self, kind: Kind, key: str, original: str | None = None) -> str:
        token = self._token(kind, key, original if original is not None else key)
        self._used[kind].add(key)
        self._occurrences[kind] += 1
        return token

    def _preload(self, kind: Kind, token: str, original: str) -> tuple[Kind, str, str] | None:
        """Take over a token of an earlier mapping; -> what its literal forms are made from."""
        if not TOKEN.fullmatch(token):
            return None
        following = int(token.rsplit("-", 1)[1]) + 1
        if kind in self._next:  # its number stays taken even if its value cannot be taken over
            self._next[kind] = max(self._next[kind], following)
        found = self._canonical(kind, original)
        if found is None:
            return None
        kind, key, _ = found
        self._tokens[kind, key] = token
        self._originals[kind][token] = original
        self._next[kind] = max(self._next[kind], following)
        return kind, key, original


def redact(bundle: Bundle, *, known: Iterable[tuple[Kind, str]] = (),
           mapping: RedactionMapping | None = None) -> tuple[Bundle, RedactionMapping]:
    """The redacted bundle and the token -> original mapping (seeded from its topology.json)."""
    redactor = Redactor(mapping)
    for kind, value in known:
        redactor.add(kind, value)
    return redactor.redact(bundle), redactor.mapping
