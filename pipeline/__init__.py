"""The shared core: ops, schedules, profiles, the simulator, timelines and metrics."""
