import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.errors import ConfigError
from pipeline.topology import Link, LinkKind, Position, Topology, is_tied_link, tied_link

_links = st.one_of(
    st.builds(Link.pp, st.integers(0, 50), st.one_of(st.none(), st.integers(0, 50))),
    st.builds(
        lambda stage, a, gap: Link.dp(stage, a, a + gap),
        st.integers(0, 50),
        st.integers(0, 50),
        st.integers(1, 50),
    ),
)


@given(_links)
def test_a_link_prints_as_it_parses(link: Link) -> None:
    assert Link.parse(str(link)) == link


@pytest.mark.parametrize(
    ("text", "kind", "group", "ends"),
    [
        ("2-3", LinkKind.PP, None, (2, 3)),
        ("pp1:2-3", LinkKind.PP, 1, (2, 3)),
        ("dp0:0-1", LinkKind.DP, 0, (0, 1)),
        (" dp3:0-7 ", LinkKind.DP, 3, (0, 7)),
    ],
)
def test_the_three_forms(text: str, kind: LinkKind, group: int | None, ends: tuple) -> None:
    link = Link.parse(text)
    assert (link.kind, link.group, (link.first, link.second)) == (kind, group, ends)


@pytest.mark.parametrize("text", ["2-4", "3-2", "2_3", "dp0-1", "pp:1-2", "x1:0-1", "", "1-"])
def test_malformed_links_are_refused(text: str) -> None:
    with pytest.raises(ConfigError):
        Link.parse(text)


def test_the_tied_route_is_named_in_one_form_and_is_no_link() -> None:
    assert (tied_link(4), tied_link(4, 1), tied_link(2)) == ("tied:0-3", "tied1:0-3", "tied:0-1")
    assert is_tied_link("tied:0-3") and is_tied_link("tied:0-3", 4)
    assert not is_tied_link("tied:0-3", 3) and not is_tied_link("tied:0-1", 1)
    assert not any(map(is_tied_link, ("tied1:0-3", "tied:0-0", "tied:0-03", "tied:1-3", "0-1")))
    with pytest.raises(ConfigError, match="a pipeline of 1 stage has no tied route"):
        tied_link(1)
    with pytest.raises(ConfigError, match="is not a link"):
        Link.parse(tied_link(4))


def test_spec_sugar() -> None:
    assert [str(Link.from_spec(v, 4)) for v in ("first", "last", 1, "dp2:0-1")] == [
        "0-1",
        "2-3",
        "1-2",
        "dp2:0-1",
    ]


@pytest.mark.parametrize(
    ("value", "num_stages", "message"),
    [
        (-1, 4, "link -1: a PP link's index is its upstream stage (0 is link 0-1), never negative"),
        ("last", 1, "link last: a pipeline of 1 stage has no PP link"),
        ("first", 1, "link first: a pipeline of 1 stage has no PP link"),
    ],
)
def test_spec_sugar_that_names_no_link_says_why(
    value: object, num_stages: int, message: str
) -> None:
    """-1 was refused as "link -1-0: write the lower end first"."""
    with pytest.raises(ConfigError) as refused:
        Link.from_spec(value, num_stages)
    assert str(refused.value) == message


def test_default_placement_and_the_position_index() -> None:
    topology = Topology(4, 2)
    assert topology.index(Position(3, 1)) == 7
    assert topology.position(6) == Position(2, 1)
    assert [topology.worker(topology.position(i)) for i in range(8)] == list(range(8))
    assert topology.host(Position(1, 1)) == 5  # one worker per host: host = worker
    assert Topology(4, 2, workers_per_host=4).host(Position(1, 1)) == 1
    assert topology.num_hosts == 8 and topology.nics == ("rnic0", "rnic1")


def test_links_exist_or_say_what_does() -> None:
    topology = Topology(4, 3)
    for text in ("2-3", "pp2:0-1", "dp3:1-2", "dp0:0-2"):
        assert topology.check(Link.parse(text)) == Link.parse(text)
    for text in ("3-4", "pp3:0-1", "dp4:0-1", "dp0:1-3", "dp0:0-3"):
        with pytest.raises(ConfigError, match="does not exist"):
            topology.check(Link.parse(text))
    assert [str(link) for link in topology.expand(Link.parse("1-2"))] == [
        "pp0:1-2",
        "pp1:1-2",
        "pp2:1-2",
    ]
    assert [str(link) for link in topology.dp_ring(1)] == ["dp1:0-1", "dp1:1-2", "dp1:0-2"]
    assert Topology(4, 2).dp_ring(0) == (Link.dp(0, 0),) and Topology(4).dp_ring(0) == ()


def test_a_swap_moves_a_logical_link_onto_other_hosts() -> None:
    topology = Topology(4)
    assert topology.hosts_of(Link.pp(0)) == (0, 1)
    swapped = topology.swapped(Position(1), Position(2))
    assert swapped.worker(Position(1)) == 2 and swapped.position_of_worker(1) == Position(2)
    assert swapped.hosts_of(Link.pp(0)) == (0, 2)  # the pair (0, 1) now carries no PP link
    assert swapped.hosts_of(Link.pp(1)) == (2, 1)
    assert swapped.swapped(Position(1), Position(2)).worker(Position(1)) == 1


@given(st.integers(1, 6), st.integers(1, 4), st.data())
def test_any_sequence_of_swaps_is_a_placement(num_stages: int, num_replicas: int, data) -> None:
    topology = Topology(num_stages, num_replicas)
    positions = st.builds(
        Position, st.integers(0, num_stages - 1), st.integers(0, num_replicas - 1)
    )
    for a, b in data.draw(st.lists(st.tuples(positions, positions), max_size=6)):
        topology = topology.swapped(a, b)
    workers = [topology.worker(topology.position(i)) for i in range(topology.num_positions)]
    assert sorted(workers) == list(range(topology.num_workers))
    assert all(
        topology.position_of_worker(w) == topology.position(i) for i, w in enumerate(workers)
    )


def test_a_placement_must_be_a_permutation() -> None:
    with pytest.raises(ConfigError, match="its own worker"):
        Topology(2, placement=(0, 0))


def test_a_link_in_a_replica_is_concrete() -> None:
    assert Link.parse("0-1").in_replica(2) == Link.pp(0, 2)
    assert Link.parse("pp1:0-1").in_replica(2) == Link.pp(0, 1)  # concrete already
    assert Link.parse("dp1:0-2").in_replica(0) == Link.dp(1, 0, 2)


def test_a_missing_link_or_position_names_the_grid_in_words() -> None:
    with pytest.raises(ConfigError) as refused:
        Topology(4, 1).check(Link.parse("pp1:2-3"))
    assert str(refused.value).startswith(
        "link pp1:2-3 does not exist with 4 stages and 1 replica ("
    )
    with pytest.raises(ConfigError) as refused:
        Topology(1, 2).check_position(Position(1, 0))
    assert str(refused.value).endswith("does not exist: 1 stage x 2 replicas")


def test_a_direction_is_a_value_and_a_link_refuses_any_other() -> None:
    """A direction was a bare string, and `Link.sender` read anything but "forward" as
    backward: "fwd" named the other end."""
    from pipeline.topology import Direction

    assert (
        Direction.between(0, 1) is Direction.FORWARD
        and Direction.between(1, 0) is Direction.BACKWARD
    )
    assert Direction.FORWARD == "forward" and f"{Direction.BACKWARD}" == "backward"  # its text
    assert Link.pp(0).sender(Direction.FORWARD) == Position(0, 0)
    assert Link.parse("dp2:0-1").sender(Direction.BACKWARD) == Position(2, 1)
    assert Link.pp(0).receiver(Direction.FORWARD) == Position(1, 0)
    assert Link.pp(2, 1).receiver(Direction.BACKWARD) == Position(2, 1)
    assert Link.parse("dp2:0-1").receiver(Direction.FORWARD) == Position(2, 1)
    with pytest.raises(ConfigError, match="a direction is forward or backward, not 'fwd'"):
        Link.pp(0).sender("fwd")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="a direction is forward or backward, not 'fwd'"):
        Link.pp(0).receiver("fwd")  # type: ignore[arg-type]


def test_a_link_of_thousands_of_digits_is_refused_as_too_large() -> None:
    """A spec's, a fault timeline's or a profile's link of 5,000 digits ("0-111...") was
    an internal error (ValueError: past Python's limit on reading a whole number)."""
    for text in ("0-" + "1" * 5000, "dp" + "1" * 5000 + ":0-1", "pp0:" + "1" * 400 + "-2"):
        with pytest.raises(ConfigError, match=r"^link '.{1,40}'\.\.\.: .* is too large a number"):
            Link.parse(text)
    assert Link.parse("0" * 5000 + "-1") == Link.pp(0)  # leading zeros are no digits of it
