"""The host agent API. ``wire`` is the only module that touches the generated code in ``v1``."""

#: The name in the control plane's client certificate, checked by every agent (see ``tls``).
CONTROL_PLANE_NAME = "stortune-control-plane"
