"""Recognise what a block device already holds from the magic numbers at its edges.

A raw-device write benchmark destroys whatever is there, so before one the
agent reads the first and last few KiB and refuses a device that carries a
filesystem, a RAID or LVM superblock, an encrypted volume or a partition table,
as blkid would report them. Pure byte matching (``detect``) plus one reader
(``read_edges``), so fixture files test it like real devices.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from pathlib import Path

#: Bytes read from the start: btrfs' superblock magic sits at 64 KiB + 64.
HEAD_BYTES = 68 * 1024
#: Bytes read from the end: md 0.90 and 1.0 superblocks live in the last 64-128 KiB.
TAIL_BYTES = 128 * 1024
_MD_MAGIC = struct.pack("<I", 0xA92B4EFC)


@dataclass(frozen=True)
class Signature:
    kind: str  # "ext2/3/4 filesystem", "md RAID superblock 1.2" ...
    offset: int  # byte offset on the device

    def __str__(self) -> str:
        return f"{self.kind} signature at byte {self.offset}"


@dataclass(frozen=True)
class Edges:
    size: int
    head: bytes
    tail: bytes
    tail_offset: int  # device offset of tail[0]

    def at(self, offset: int, length: int) -> bytes | None:
        if offset + length <= len(self.head):
            return self.head[offset:offset + length]
        start = offset - self.tail_offset
        if start >= 0 and start + length <= len(self.tail):
            return self.tail[start:start + length]
        return None


# (kind, offset from the start, magic)
_HEAD_MAGICS: tuple[tuple[str, int, bytes], ...] = (
    ("xfs filesystem", 0, b"XFSB"),
    ("LUKS encrypted volume", 0, b"LUKS\xba\xbe"),
    ("btrfs filesystem", 65600, b"_BHRfS_M"),
    ("GPT partition table", 512, b"EFI PART"),
    ("GPT partition table", 4096, b"EFI PART"),
    ("md RAID superblock 1.1", 0, _MD_MAGIC),
    ("md RAID superblock 1.2", 4096, _MD_MAGIC),
    ("bcache", 4120, b"\xc6\x85\x73\xf6\x4e\x1a\x45\xca\x82\x65\xf5\x7f\x48\xba\x6d\x81"),
)
_SWAP = (b"SWAPSPACE2", b"SWAP-SPACE")
_PAGE_SIZES = (4096, 8192, 16384, 65536)


def _ext(edges: Edges) -> bool:
    """0xEF53 at 1080 plus a sane superblock: two bytes alone match random data too often."""
    sb = edges.at(1024, 104)
    if sb is None or sb[56:58] != b"\x53\xef":
        return False
    inodes, blocks = struct.unpack_from("<II", sb, 0)
    log_block, = struct.unpack_from("<I", sb, 24)
    rev, = struct.unpack_from("<I", sb, 76)
    return bool(inodes > 0 and blocks > 0 and log_block <= 6 and rev <= 1)


def _mbr(edges: Edges) -> bool:
    """0x55AA at 510 and four partition entries whose boot flags are 0x00 or 0x80."""
    sector = edges.at(0, 512)
    return (sector is not None and sector[510:512] == b"\x55\xaa"
            and all(sector[446 + 16 * i] in (0x00, 0x80) for i in range(4)))


def detect(edges: Edges) -> list[Signature]:
    """Every known signature found, in offset order."""
    found: list[Signature] = []
    for kind, offset, magic in _HEAD_MAGICS:
        if edges.at(offset, len(magic)) == magic:
            found.append(Signature(kind, offset))
    if _ext(edges):
        found.append(Signature("ext2/3/4 filesystem", 1080))
    for label in range(4):  # the LVM2 label may sit in any of the first four sectors
        sector = edges.at(label * 512, 32)
        if sector is not None and sector[:8] == b"LABELONE" and sector[24:32] == b"LVM2 001":
            found.append(Signature("LVM2 physical volume", label * 512))
    for page in _PAGE_SIZES:
        if edges.at(page - 10, 10) in _SWAP:
            found.append(Signature("swap area", page - 10))
    if _mbr(edges) and not any(s.kind.startswith(("GPT", "ext", "xfs")) for s in found):
        found.append(Signature("DOS partition table or boot sector", 510))
    if edges.size >= 128 * 1024:
        v090 = (edges.size & ~0xFFFF) - 0x10000  # md 0.90: 64 KiB-aligned, 64 KiB from the end
        if edges.at(v090, 4) == _MD_MAGIC:
            found.append(Signature("md RAID superblock 0.90", v090))
        v10 = ((edges.size >> 9) - 16 & ~7) * 512  # md 1.0: 8 KiB from the end, 4 KiB aligned
        if edges.at(v10, 4) == _MD_MAGIC:
            found.append(Signature("md RAID superblock 1.0", v10))
    return sorted(found, key=lambda s: s.offset)


def read_edges(path: Path) -> Edges:
    """The first HEAD_BYTES and last TAIL_BYTES of a device (or file). Raises OSError."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.lseek(fd, 0, os.SEEK_END)
        head = os.pread(fd, min(HEAD_BYTES, size), 0)
        tail_offset = max(0, size - TAIL_BYTES)
        tail = os.pread(fd, size - tail_offset, tail_offset)
    finally:
        os.close(fd)
    return Edges(size, head, tail, tail_offset)
