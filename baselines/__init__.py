"""The systems Adaptra is compared with: 1F1B and ZeroBubble (handcrafted and automatic; its
schedules are in pipeline/, since Adaptra's scheduler weighs them too), and Falcon."""

from baselines.one_f_one_b import one_f_one_b
from pipeline.zb_auto import zb_auto
from pipeline.zero_bubble import zb_h1, zb_h2

__all__ = ["one_f_one_b", "zb_auto", "zb_h1", "zb_h2"]
