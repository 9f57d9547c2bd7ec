"""The systems Adaptra is compared with: 1F1B and ZeroBubble (handcrafted and automatic)."""

from baselines.one_f_one_b import one_f_one_b
from baselines.zb_auto import zb_auto
from baselines.zero_bubble import zb_h1, zb_h2

__all__ = ["one_f_one_b", "zb_auto", "zb_h1", "zb_h2"]
