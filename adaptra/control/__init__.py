"""Adaptra's control plane from measurements: the straggler detector and the controller."""

from adaptra.control.controller import DelegatingController, DetectingController
from adaptra.control.detector import Belief, LinkDetector, Thresholds, unmeasurable_kinds

__all__ = [
    "Belief",
    "DelegatingController",
    "DetectingController",
    "LinkDetector",
    "Thresholds",
    "unmeasurable_kinds",
]
