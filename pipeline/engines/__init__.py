"""Engines (sim, emulated, megatron) behind one interface, and the controller interface."""

from pipeline.engines.base import Action, Capabilities, Engine, Outcome, Plan, check_plan
from pipeline.engines.control import Controller, Measuring, check_link_terms

__all__ = [
    "Action",
    "Capabilities",
    "Controller",
    "Engine",
    "Measuring",
    "Outcome",
    "Plan",
    "check_link_terms",
    "check_plan",
]
