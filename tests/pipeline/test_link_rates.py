"""A profile's own link rates, and what a cap adds on top of them."""

import pytest

from pipeline.link_rates import NO_RATES, LinkRates
from pipeline.profile import Profile
from pipeline.topology import Link

MBIT = 125_000
"""1 Mbit: 10 ms at 0.1 Gbit/s."""


def test_a_cap_replaces_the_link_s_rate_where_slower() -> None:
    rates = LinkRates(pp_gbit_s=0.1, dp_gbit_s=1.0)
    pp, dp = Link.pp(0, 0), Link.dp(0, 0, 1)
    assert rates.cap_ms(pp, MBIT, 0.05) == pytest.approx(20.0 - 10.0)  # bytes/cap - bytes/rate
    assert rates.cap_ms(pp, MBIT, 0.1) == 0.0  # as fast as the link: nothing
    assert rates.cap_ms(pp, MBIT, 1.0) == 0.0  # faster: nothing
    assert rates.cap_ms(dp, MBIT, 0.1) == pytest.approx(10.0 - 1.0)  # the DP link's own rate
    assert NO_RATES.cap_ms(pp, MBIT, 0.1) == pytest.approx(10.0)  # unlimited: the whole term


def test_a_profile_s_rates_are_the_ones_it_times_messages_at() -> None:
    plain = Profile.uniform(2, 2, 1, 1, 1, link_bandwidth_gbps=0.1)
    assert plain.link_rates == LinkRates(pp_gbit_s=0.1, dp_gbit_s=0.1)
    dp = Profile.uniform(2, 2, 1, 1, 1, num_replicas=2, link_bandwidth_gbps=0.1,
                         dp_bandwidth_gbps=0.5)  # fmt: skip
    assert dp.link_rates == LinkRates(pp_gbit_s=0.1, dp_gbit_s=0.5)
    assert dp.dp_wire_ms(MBIT) == pytest.approx(2.0)
    assert Profile.uniform(2, 2, 1, 1, 1).link_rates == NO_RATES


@pytest.mark.parametrize("rate", [0.0, -1.0, float("inf"), float("nan")])
def test_a_bad_rate_is_refused(rate: float) -> None:
    with pytest.raises(ValueError, match="a link rate"):
        LinkRates(pp_gbit_s=rate)
