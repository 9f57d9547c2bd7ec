"""The user-facing layer: CLI, experiments, results and reports."""
