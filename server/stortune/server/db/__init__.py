"""Storage of the control plane: engine, tables and migrations."""
