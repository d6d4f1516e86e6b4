"""Hardware RAID controllers behind one seam: an adapter per vendor tool.

``ControllerAccess`` (access.py) is what the rest of the agent uses: the inventory, each
volume's policies, and writing them. ``discover_controllers(runner)`` asks every adapter; a
tool that is not on the tool path means its controllers are not managed (``unmanaged``), a
tool that fails is an error for its controllers only, never for the rest of the host.

Nothing is imported here: the adapters load only when a vendor tool is found (idle RSS).
"""
