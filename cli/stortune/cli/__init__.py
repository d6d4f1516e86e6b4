"""``stortune``, the command-line client of the control plane: a REST client, like kubectl.

It imports nothing of the server or the agent; documents are validated with
``stortune.schemas`` before anything is sent.
"""
