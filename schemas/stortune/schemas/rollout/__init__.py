"""Progressive rollouts (issue 27): the ``spec.rollout`` document, the dealing of hosts to
waves and the rollout state machine. Pure: the control plane stores the state and executes
the actions (server/stortune/server/rollout_driver.py, docs/rollouts.md)."""
