"""Adaptra, the system under test: its scheduler and its delegate transport (to come)."""
