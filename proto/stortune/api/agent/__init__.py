"""The host agent API. ``wire`` is the only module that touches the generated code in ``v1``."""
