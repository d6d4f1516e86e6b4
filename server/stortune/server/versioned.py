"""Values kept with the resourceVersion they were read or made at.

While an object's resourceVersion (or the global counter, for what depends on
everything) stands still, what was derived from it still holds: an encoded
document, the reconciler's view of a host. One small thread-safe LRU serves
them all.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class VersionedCache(Generic[K, V]):
    def __init__(self, size: int) -> None:
        self._size = size
        self._entries: OrderedDict[K, tuple[int, V]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K, version: int) -> V | None:
        """The value kept for ``key`` at exactly ``version``."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry[0] != version:
                return None
            self._entries.move_to_end(key)
            return entry[1]

    def put(self, key: K, version: int, value: V) -> None:
        """Keep ``value``, unless a newer version is kept already: a slower reader of an older
        snapshot must not replace what a faster one stored."""
        with self._lock:
            current = self._entries.get(key)
            if current is not None and current[0] > version:
                return
            self._entries[key] = (version, value)
            self._entries.move_to_end(key)
            while len(self._entries) > self._size:
                self._entries.popitem(last=False)
