"""The host agent API. ``wire`` is the only module that touches the generated code in ``v1``."""

#: The name in the control plane's client certificate, checked by every agent (see ``tls``).
CONTROL_PLANE_NAME = "stortune-control-plane"

#: The header carrying the agent's host key on its REST calls (agent: ``stortune.agent.hostkey``;
#: control plane: ``stortune.server.services.host_keys``).
HOST_KEY_HEADER = "X-Stortune-Host-Key"
