import json

import pytest

from baselines import one_f_one_b
from pipeline.allreduce import AllReduce
from pipeline.errors import ConfigError
from pipeline.profile import Profile
from pipeline.simulator import CommMode, simulate
from pipeline.timeline import SCHEMA_VERSION, MessageRecord, Timeline


def _timeline() -> Timeline:
    profile = Profile.uniform(2, 4, 1, 2, 1, delay_ms=(3.0,))
    ring = AllReduce(num_replicas=2, grad_bytes=(1_000_000, 1_000_000), bandwidth_gbps=8.0)
    return simulate(one_f_one_b(profile), profile, CommMode.DIRECT, allreduce=ring)


def test_messages_carry_arrival_and_need_through_json() -> None:
    timeline = _timeline()
    assert SCHEMA_VERSION == 2
    assert MessageRecord._fields[7:] == ("arrival_ms", "needed_ms", "replica")
    assert {m.replica for m in timeline.messages} == {0, 1}
    data = json.loads(json.dumps(timeline.to_dict()))
    assert data["schema_version"] == SCHEMA_VERSION
    assert Timeline.from_dict(data) == timeline


def test_a_version_1_timeline_is_refused() -> None:
    data = _timeline().to_dict()
    # Version 1 rows had no needed_ms: 9 fields, replica where needed_ms now is.
    old = {**data, "schema_version": 1, "messages": [r[:8] + r[9:] for r in data["messages"]]}
    with pytest.raises(ConfigError, match=r"schema version 1 is not supported \(expected 2\)"):
        Timeline.from_dict(old)


def test_a_row_short_of_a_field_is_refused() -> None:
    data = _timeline().to_dict()
    short = {**data, "messages": [data["messages"][0][:9], *data["messages"][1:]]}
    with pytest.raises(ConfigError, match=r"messages\[0\] must be a list of the 10 fields"):
        Timeline.from_dict(short)
    with pytest.raises(ConfigError, match=r"ops\[1\] must be a list of the 7 fields"):
        Timeline.from_dict({**data, "ops": [data["ops"][0], "F0"]})
