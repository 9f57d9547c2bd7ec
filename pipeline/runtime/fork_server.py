"""Imported last by the workers' fork server (`hooks.WORKER_PRELOAD`), after torch and the
worker: freezes every object the server holds (`gc.freeze`), so that no collection looks at
them again. Its forked workers then share those pages instead of copying them as their
collector touches them, and the server's own exit, at the controller's, skips collecting torch's
objects: about 0.15 s where it took 0.5 s here (BENCHMARKS.md, "Shutdown"). Imported
anywhere else it only freezes that process's objects so far."""

from __future__ import annotations

import gc

gc.freeze()
