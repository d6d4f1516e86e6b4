"""Keep the long-running agent's heap small (glibc).

glibc gives threads their own malloc arenas and keeps freed pages mapped; an idle agent with
its gRPC workers, heartbeat and device watch holds megabytes it no longer uses. Two arenas
are plenty for a process that mostly waits, and trimming now and then returns what
discovery, plans and RPCs freed. Elsewhere (musl, no libc found) both are no-ops.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from typing import Final

#: mallopt(3) parameter number of M_ARENA_MAX in glibc's malloc.h.
M_ARENA_MAX: Final = -8
#: Arenas for the agent: the main one and one shared by every thread.
ARENAS: Final = 2
#: How often the idle agent hands freed heap back to the kernel.
TRIM_INTERVAL_S: Final = 30.0


@functools.cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    if libc is None or not hasattr(libc, "mallopt") or not hasattr(libc, "malloc_trim"):
        return None
    return libc


def limit_arenas(arenas: int = ARENAS) -> bool:
    """Cap malloc arenas; call before the agent starts its threads. True when glibc took it."""
    libc = _libc()
    return bool(libc is not None and libc.mallopt(M_ARENA_MAX, arenas) == 1)


def trim() -> bool:
    """Return freed heap pages to the kernel. True when some memory was released."""
    libc = _libc()
    return bool(libc is not None and libc.malloc_trim(0) == 1)
