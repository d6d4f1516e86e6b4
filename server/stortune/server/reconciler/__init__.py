"""The reconciler: keeps every host converged to the profiles that select it.

``queue``      host names, de-duplicated, one worker per key, per-key backoff
``decide``     pure: which differences are drift, whether to call Apply
``report``     pure: the status and events a reconcile writes
``reconcile``  one pass over one host (read, ask the agent, decide, act, write)
``runner``     the Reconciler: workers, the periodic pass, start/stop
``store``      its short database transactions, through the services
``summary``    pure: a profile's status counted over the fleet
"""

from stortune.server.reconciler.runner import Reconciler

__all__ = ["Reconciler"]
