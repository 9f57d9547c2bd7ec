from adaptra.slackness import analyse, eq1_absorbs, slackness, theorem1_threshold_ms
from pipeline.profile import Profile
from pipeline.schedule import Schedule


def test_slackness_and_threshold() -> None:
    assert slackness((7, 5, 3, 1)) == (2, 2, 2)
    assert theorem1_threshold_ms(3, 10.0) == 20.0
    assert theorem1_threshold_ms(0, 10.0) == 0.0


def test_eq1_on_the_fig4_profile() -> None:
    # tF + tB + 2c <= Delta (tF + tB): 20 + 2c <= 2 * 20 holds up to c = 10 ms.
    assert eq1_absorbs(Profile.uniform(4, 12, 10, 10, 10, delay_ms=(10.0,)), 0, 2)
    assert not eq1_absorbs(Profile.uniform(4, 12, 10, 10, 10, delay_ms=(11.0,)), 0, 2)
    assert eq1_absorbs(Profile.uniform(4, 12, 10, 10, 10, delay_ms=(20.0,)), 0, 3)


def test_analyse_a_schedule(fig4_fixture: dict) -> None:
    profile = Profile.uniform(4, 12, 10, 10, 10, delay_ms=(40.0,))
    links = analyse(profile, Schedule.from_dict(fig4_fixture))
    assert [link.link for link in links] == ["0-1", "1-2", "2-3"]
    assert [link.slackness for link in links] == [2, 2, 2]
    assert [link.eq1_absorbed for link in links] == [False, True, True]
    assert links[0].predicted_cost_ms == 12 * 40 / 3
    assert links[1].predicted_cost_ms == 0.0
