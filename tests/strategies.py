"""Hypothesis strategies shared by the tests."""

from __future__ import annotations

from hypothesis import strategies as st

from pipeline.profile import Profile


@st.composite
def profiles(draw: st.DrawFn, max_stages: int = 6, with_delays: bool = True) -> Profile:
    """Random non-uniform profiles with integer-ms times, N >= S."""
    num_stages = draw(st.integers(1, max_stages))
    num_microbatches = draw(st.integers(num_stages, 3 * num_stages + 2))
    times = st.lists(st.integers(0, 20), min_size=num_stages, max_size=num_stages)
    delays = (
        draw(st.lists(st.integers(0, 40), min_size=num_stages - 1, max_size=num_stages - 1))
        if with_delays
        else []
    )
    return Profile(
        num_stages=num_stages,
        num_microbatches=num_microbatches,
        t_f_ms=tuple(map(float, draw(times))),
        t_b_ms=tuple(map(float, draw(times))),
        t_w_ms=tuple(map(float, draw(times))),
        delay_ms=tuple(map(float, delays)),
        message_bytes=draw(st.sampled_from([0, 1 << 20])),
        link_latency_ms=draw(st.sampled_from([0.0, 0.5])),
        link_bandwidth_gbps=draw(st.sampled_from([None, 10.0])),
    )
