"""Redis Cluster hash slots: which slot a key lives in, and the companion keys of a lease.

Redis Cluster runs a script only when every key it touches lives in one hash
slot (else ``CROSSSLOT``). A lease's fence counter and its release tombstone
are touched together with the lease, so they must share its slot, for every
caller's key, including keys that contain ``{`` or ``}`` (which start or end a
*hash tag*: when a key holds ``{...}`` with something inside, only that part
is hashed). The lease key itself stays byte for byte ``task-lock:<key>``;
the companion keys carry a hash tag chosen to hash to the lease's slot (a
table from slot to a short tag, built once per process), followed by the
caller's key: the first ``{`` and the first ``}`` of the name are the tag's
own, so nothing in the caller's key can move it.

The same names are used on a single Redis, where slots mean nothing: one
code path for both. The table is part of the stored format: every worker
must name a lock's counter alike, so it never changes between versions.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterable, Sequence
from typing import TypeVar

SLOTS = 16384
_ALPHABET = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz-_"

T = TypeVar("T")


@functools.cache
def _crc_table() -> tuple[int, ...]:
    """CRC-16/XMODEM (polynomial 0x1021, initial 0), the CRC Redis Cluster hashes keys with."""
    table = []
    for byte in range(256):
        crc = byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021 if crc & 0x8000 else crc << 1) & 0xFFFF
        table.append(crc)
    return tuple(table)


def _crc16(data: bytes) -> int:
    table = _crc_table()
    crc = 0
    for byte in data:
        crc = ((crc << 8) & 0xFFFF) ^ table[(crc >> 8) ^ byte]
    return crc


@functools.lru_cache(maxsize=1 << 16)
def key_slot(key: str | bytes) -> int:
    """The hash slot of ``key``, as Redis Cluster computes it (its hash tag, if it has one).

    Remembered for the last 65,536 keys: the heartbeat asks again for every
    lease at every tick.
    """
    data = key.encode() if isinstance(key, str) else key
    start = data.find(b"{")
    if start >= 0:
        end = data.find(b"}", start + 1)
        if end > start + 1:
            data = data[start + 1 : end]
    return _crc16(data) % SLOTS


@functools.cache
def _tags() -> tuple[str, ...]:
    """For each slot, a tag of letters, digits, ``-`` and ``_`` that hashes to it.

    Every string of three characters from an alphabet of 64, in order; the
    first to reach a slot names it. The CRC runs one byte at a time over a
    shared prefix, so this costs about 0.1 s, once per process.
    """
    table = _crc_table()
    found: list[str | None] = [None] * SLOTS
    missing = SLOTS

    def step(crc: int, byte: int) -> int:
        return ((crc << 8) & 0xFFFF) ^ table[(crc >> 8) ^ byte]

    for length in itertools.count(1):
        for prefix in itertools.product(_ALPHABET, repeat=length - 1):
            crc = 0
            for byte in prefix:
                crc = step(crc, byte)
            for last in _ALPHABET:
                slot = step(crc, last) % SLOTS
                if found[slot] is None:
                    found[slot] = bytes((*prefix, last)).decode()
                    missing -= 1
            if not missing:
                return tuple(tag for tag in found if tag is not None)
    raise AssertionError("unreachable")  # pragma: no cover


def tag_for(stored: str) -> str:
    """The hash tag, braces included, that puts a key in the slot of ``stored``."""
    return "{" + _tags()[key_slot(stored)] + "}"


def by_slot(stored: Sequence[str], items: Sequence[T]) -> Iterable[list[T]]:
    """``items`` (one per stored key, in the same order) grouped by their key's slot.

    Groups in order of first appearance; within a group, the items' order.
    """
    groups: dict[int, list[T]] = {}
    for key, item in zip(stored, items, strict=True):
        groups.setdefault(key_slot(key), []).append(item)
    return groups.values()


def chunked(stored: Sequence[str], size: int, *, per_slot: bool) -> list[list[int]]:
    """The indexes of ``stored`` in chunks of at most ``size``; with ``per_slot``,
    each chunk's keys all in one hash slot (grouped as :func:`by_slot` does)."""
    indexes = range(len(stored))
    groups = by_slot(stored, indexes) if per_slot else [list(indexes)]
    return [group[i : i + size] for group in groups for i in range(0, len(group), size)]
