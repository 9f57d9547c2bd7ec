"""Falcon-style mitigation of a slow DP link (arXiv 2410.12588): detection from
measurements, then ignore, rebalance, swap or restart by the ski-rental rule."""

from baselines.falcon.controller import FalconController, FalconCosts, Level

__all__ = ["FalconController", "FalconCosts", "Level"]
