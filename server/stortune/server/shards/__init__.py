"""Dividing the hosts among the servers that share one database.

Every host belongs to one of ``SHARDS`` shards (a stable hash of its name). On
PostgreSQL each server runs a ``ShardKeeper``: it holds leases on its share of the
shards in ``shard_leases`` and renews them; reconciles, benchmark runs and
experiments of a host are driven only by the server holding the host's shard,
and every database transaction of that work is fenced by the lease's generation
(``fenced``), so a server that lost a shard cannot write over its new owner's
work. ``Notices`` carries "reconcile this host" from the server that took the
API call to the one that owns the host. On SQLite one process owns everything
(``AllShards``).
"""

from stortune.server.shards.keeper import ShardKeeper
from stortune.server.shards.notices import Notices
from stortune.server.shards.ownership import (
    SHARDS,
    AllShards,
    Fence,
    LeaseLost,
    Ownership,
    ensure_held,
    fenced,
    moved,
    shard_of,
)

__all__ = ["SHARDS", "AllShards", "Fence", "LeaseLost", "Notices", "Ownership", "ShardKeeper", "ensure_held",
           "fenced", "moved", "shard_of"]
