"""Tuning experiments on the control plane: the per-host driver, the evidence and the charts."""
