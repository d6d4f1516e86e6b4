"""Where the limit is: layer ceilings, bottleneck verdicts, slow members, layout checks and
RAID planning. Pure functions over a ``Topology``, benchmark results and probe figures, shared
by the agent (``stortune-agent analyze``), the control plane and the CLI."""
