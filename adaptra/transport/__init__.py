"""Adaptra's delegate transport: delegate processes that carry a trainer's messages
(delegate.py) and the trainer's side of them (delegated.py)."""

from adaptra.transport.delegated import Delegates, DelegateTransport

__all__ = ["DelegateTransport", "Delegates"]
