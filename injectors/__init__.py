"""Fault injectors and the network testbed (to come)."""
