"""A runtime engine (emulated or megatron) on a namespace testbed (`--inject network`): faults
in the network, not in the workers.

One host per worker (stage and replica). At every iteration boundary the testbed takes what
is in force: each host pair with an effect gets its state on rnic0, from the iteration's
start or from the event's `at_ms` into it (delay, jitter, a redrawn normal delay, a cap, a
stall, down), on kernel netem where netem can express it and the kernel has it, else on a
userspace wire (`Testbed.set_wire` decides; a pair with changes inside the iteration takes
the wire at the boundary); a failed NIC goes down through pyroute2 (at its `at_ms`, by a
timer), and comes back up the same way where an event ends the failure inside an
iteration. The profile's link delays and bandwidth are the pairs' base on both data NICs
(the bandwidth as htb caps; on rnic1 for what fails over to it, without the faults), by the
role each pair plays under the iteration's placement, as in the simulator and the detector: a
rank swap moves a link's delay and bandwidth to the pair that carries the link from then on
(a fault timeline's faults stay on their hosts); the workers get plans without them (no PP
or DP ring delay) and no fault view, so they sleep no delay and their messages carry no
`fault_ms`. A worker notices a failed NIC or link as a real job does: its wait for a message
times out (`Recovery.transport_timeout_s`); the engine reports that as a `LinkFailure` at
the measured time, and a restart repairs the testbed (every NIC up, every
wire at its base) before the fresh pool starts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import NamedTuple

from injectors.fault_model import Effect, Held, InForce
from injectors.testbed import DATA_PLANES, PLANES, Testbed, TestbedError
from injectors.wire import HEALTHY, WireState
from pipeline.engines import Capabilities, Engine, Outcome, Plan
from pipeline.engines.base import Closing
from pipeline.errors import ConfigError, LinkFailure
from pipeline.faults import NO_FAULTS, IterationFaults
from pipeline.link_terms import LinkTerms
from pipeline.profile import Profile
from pipeline.runtime.remote_error import WorkerCrash, WorkerError, WorkerTimeout
from pipeline.topology import Link, Topology

__all__ = ["TESTBED_LINK_TERMS", "NicChange", "network_engine"]

TESTBED_LINK_TERMS = LinkTerms(latency=False, bandwidth=True, delegate_rate=False)
"""What the testbed imposes on every message (pipeline.link_terms): the profile's bandwidths
as htb caps on each pair (`network_engine`), no latency (a pair's base wire holds its link's
delay only: `_base_states`), and no delegate rate (a delegate's messages cross the same
caps as a worker's)."""

_Pair = tuple[int, int]
_Changes = tuple[tuple[float, WireState, WireState], ...]
"""A wire's states in one iteration: (from ms into it, forward state, backward state)."""


def _base_states(profile: Profile, topology: Topology) -> dict[_Pair, WireState]:
    """The host pair of each PP link of every replica and of each DP ring link under
    `topology`'s placement, with the profile's own delay and bandwidth for the link."""
    rates, dp_delays = profile.link_rates, dict(profile.dp_delay_ms)
    links = [
        (Link.pp(stage, replica), profile.delay_ms[stage])
        for replica in range(profile.num_replicas)
        for stage in range(profile.num_stages - 1)
    ]
    links += [
        (link, dp_delays.get(link, 0.0))
        for stage in range(profile.num_stages)
        for link in topology.dp_ring(stage)
    ]
    states = {}
    for link, delay_ms in links:
        a, b = sorted(topology.hosts_of(link))
        gbit_s = rates.of(link)
        rate_bit_s = None if gbit_s is None else gbit_s * 1e9
        states[a, b] = WireState(delay_ms=delay_ms, rate_bit_s=rate_bit_s)
    return states


def _unwired(base: dict[_Pair, WireState], pair: _Pair) -> _Changes:
    """What a pair's traffic meets with no wire: the profile's bandwidth (as htb caps)."""
    rate = base[pair].rate_bit_s if pair in base else None
    state = WireState(rate_bit_s=rate)
    return ((0.0, state, state),)


def _wire_state(
    base: WireState, effects: list[Effect], seed: str, stall_since_ms: float = 0.0
) -> WireState:
    """`base` with `effects` (of different kinds) added: delays add up, the lowest cap holds
    (the base's, the link's own rate, too: pipeline.link_rates); a stall began
    `stall_since_ms` into the iteration."""
    drawn = any(effect.jitter_ms or effect.normal_ms for effect in effects)
    stalls = any(effect.stall_ms for effect in effects)
    state = dataclasses.replace(  # plain: equal every time
        base, seed=seed if drawn else "", stall_since_ms=stall_since_ms if stalls else 0.0
    )
    for effect in effects:
        rate = None if effect.bandwidth_gbps is None else effect.bandwidth_gbps * 1e9
        if rate is not None and state.rate_bit_s is not None:
            rate = min(rate, state.rate_bit_s)
        state = dataclasses.replace(
            state,
            delay_ms=state.delay_ms + effect.delay_ms,
            jitter_ms=state.jitter_ms + effect.jitter_ms,
            normal_ms=effect.normal_ms or state.normal_ms,
            redraw_every_ms=effect.redraw_every_ms if effect.normal_ms else state.redraw_every_ms,
            rate_bit_s=rate if rate is not None else state.rate_bit_s,
            stall_ms=state.stall_ms + effect.stall_ms,
            down=state.down or effect.down,
        )
    return state


def _wire_changes(base: WireState, effects: tuple[Held, ...], seed: str) -> _Changes:
    """The states a pair's wire takes through one iteration: one from each offset where an
    effect starts or ends, with the effects that hold from there (a stall is paid once per
    direction: the wire keeps it paid through the iteration's later changes, until another
    stall row starts)."""
    changes = []
    ends = {held.until_ms for held in effects if held.until_ms < math.inf}
    for from_ms in sorted({0.0} | {held.from_ms for held in effects} | ends):
        holding = [h for h in effects if h.holds_at(from_ms)]
        held = [h.effect for h in holding]
        since_ms = next((h.from_ms for h in holding if h.effect.stall_ms), 0.0)
        changes.append(
            (
                from_ms,
                _wire_state(base, held, f"{seed}:forward:{from_ms}", since_ms),
                _wire_state(base, held, f"{seed}:backward:{from_ms}", since_ms),
            )
        )
    return tuple(changes)


class _Outage(NamedTuple):
    """A NIC down from `from_ms` into an iteration until `until_ms` (inf: its end)."""

    from_ms: float
    until_ms: float


def _outages(effects: tuple[Held, ...]) -> tuple[_Outage, ...]:
    """A NIC's outages in an iteration, in order: its failures' spans, joined where they
    overlap or meet (it is up between two that do not)."""
    outages: list[_Outage] = []
    for held in sorted(effects, key=lambda held: (held.from_ms, held.until_ms)):
        if outages and held.from_ms <= outages[-1].until_ms:
            last = outages[-1]
            outages[-1] = _Outage(last.from_ms, max(last.until_ms, held.until_ms))
        else:
            outages.append(_Outage(held.from_ms, held.until_ms))
    return tuple(outages)


@dataclasses.dataclass(slots=True)
class _Network:
    """What the testbed is to do in one iteration."""

    wires: dict[_Pair, _Changes]
    nics_down: dict[tuple[int, int], tuple[_Outage, ...]]
    """(host, plane) -> when in the iteration it is down (`_outages`)."""

    @property
    def fails(self) -> bool:
        return bool(self.nics_down) or any(
            state.down for changes in self.wires.values() for _, state, _ in changes
        )


def _network(faults: IterationFaults, base: dict[_Pair, WireState], iteration: int) -> _Network:
    wires: dict[_Pair, _Changes] = {pair: ((0.0, s, s),) for pair, s in base.items()}
    nics_down: dict[tuple[int, int], tuple[_Outage, ...]] = {}
    if faults is NO_FAULTS:
        return _Network(wires, nics_down)
    if not isinstance(faults, InForce):
        raise ConfigError("--inject network takes a fault timeline file's faults only")
    for unit, effects in faults.effects.items():
        kind, host, other = unit
        if kind == "nic":
            assert isinstance(other, str)
            if not all(held.effect.down for held in effects):
                raise ConfigError(
                    f"iteration {iteration}: --inject network takes a NIC down, not another "
                    f"effect on a NIC ({other} of host {host}); replay it with --inject hook"
                )
            plane = faults.topology.nics.index(other)
            nics_down[host, plane] = _outages(effects)
            continue
        assert isinstance(other, int)
        seed = f"{faults.seed}:{host}-{other}:{iteration}"
        wires[host, other] = _wire_changes(base.get((host, other), HEALTHY), effects, seed)
    return _Network(wires, nics_down)


def _lasting(changes: tuple[tuple[float, WireState, WireState], ...]) -> bool:
    """Whether a pair's wire states, once set, hold for the next iteration with the same ones
    too: one state without a stall (a stall is paid again each iteration it is in force, so
    it is set again)."""
    return len(changes) == 1 and not any(f.stall_ms or b.stall_ms for _, f, b in changes)


def _nics_up(down: set[tuple[int, int]], network: _Network) -> set[tuple[int, int]]:
    """The NICs of `down` to bring up as the iteration starts: all but those down from its
    start (one down again later in it is up until then: its timer takes it down)."""
    return down - {nic for nic, outages in network.nics_down.items() if not outages[0].from_ms}


def _static_delays(profile: Profile) -> tuple[tuple[float, ...], dict[Link, float]]:
    """A profile's PP and DP ring link delays, which the testbed holds on its wires."""
    return profile.delay_ms, dict(profile.dp_delay_ms)


_GLOO_TEXT = re.compile(r"/gloo/|pair closure")
"""What gloo's own RuntimeErrors say: where in gloo ("[.../third_party/gloo/gloo/transport/tcp/
pair.cc:553] Connection closed by peer", "[.../unbound_buffer.cc:129] Timed out waiting
5000ms for send operation to complete", seen on the testbed with a NIC down mid-send or the
peer killed), or "Application timeout caused pair closure" (a later call on that pair). Not
any C++ file's: torch's own ("[enforce fail at inline_container.cc:672] ...", a checkpoint
written to a full disk) is no link's."""


def _gloo_gave_up(err: WorkerError) -> bool:
    """How a dead NIC or link shows in a worker: a wait or a send timed out (a TimeoutError:
    "Timed out waiting ...", "Application timeout caused pair closure"), or its connection
    broke (the transport's ConnectionError, "Connection reset by peer" in a send or a wait,
    or gloo's bare RuntimeError, by its text, from a call the transport does not wrap); a
    worker that died without a word is a crash, not this, and so is any other exception
    (another RuntimeError too: a model's shape error is a bug, whatever the network did)."""
    if isinstance(err, WorkerTimeout):
        return True
    remote = err.remote
    return (
        isinstance(err, WorkerCrash)
        and remote is not None
        and (
            remote.is_a(ConnectionError)
            or (
                remote.type_name == "builtins.RuntimeError"
                and _GLOO_TEXT.search(remote.message) is not None
            )
        )
    )


class NicChange(NamedTuple):
    """A NIC the engine took down (or brought up) inside an iteration: `at_ms` into it, when
    the call that set it began (the kernel had it so at most that call's time later)."""

    iteration: int
    host: int
    plane: int
    at_ms: float
    up: bool = False


class _NetworkEngine(Closing):
    """An emulated engine whose faults are in a testbed's network (see the module)."""

    def __init__(
        self,
        bed: Testbed,
        profile: Profile,
        timeout_s: float,
        delegated: bool = False,
        notices: bool = True,
        longest_hold_ms: float = 0.0,
        model: str | None = None,
        seed: int = 0,
    ) -> None:
        """`model`: the megatron backend's model (None: the emulated backend), `seed` its
        initial weights and data; `delegated`:
        start delegates, which listen on their hosts' NICs (their traffic
        crosses the testbed's wires as the workers' does) and fail over between them;
        `notices`: their receivers tell their senders of a NIC's failure over the management
        plane (False: the senders notice it by TCP's user timeout); `longest_hold_ms`: the
        longest a fault may hold a message (their TCP timeout stays well above it)."""
        from adaptra.transport import Delegates  # torch: only when needed
        from adaptra.transport.delegated import USER_TIMEOUT_MS
        from pipeline.engines.runtime import emulated_engine, megatron_engine

        self.bed, self.profile = bed, profile
        self._base: dict[_Pair, WireState] = {}
        self._wired: set[_Pair] = set()
        """The pairs with a wire on rnic1 and up (their base's delay)."""
        self._place(profile.topology)
        nics = range(len(DATA_PLANES))
        addresses = tuple(
            tuple(bed.address(host, plane) for plane in nics) for host in range(bed.num_hosts)
        )
        management = PLANES.index("mgmt")
        told = tuple(bed.address(host, management) for host in range(bed.num_hosts))
        make = (
            emulated_engine
            if model is None
            else functools.partial(megatron_engine, model=model, seed=seed)
        )
        self._inner = make(
            profile.num_stages,
            num_replicas=profile.num_replicas,
            launch=bed.launcher(),
            timeout_s=timeout_s,
            on_start=self._start,
            delegates=Delegates(
                addresses,
                DATA_PLANES,
                timeout_ms=max(USER_TIMEOUT_MS, round(2 * longest_hold_ms) + 1000),
                notice_addresses=told if notices else (),
            )
            if delegated
            else None,
        )
        self._wires: dict[_Pair, _Changes] = {}
        self._nics_down: set[tuple[int, int]] = set()
        self._pending: _Network | None = None
        self._timers: list[threading.Timer] = []
        self._started_at: float | None = None
        self._iteration = 0
        self.nic_changes: list[NicChange] = []
        """Every NIC a timer took down or brought up inside an iteration, and when."""
        self._timer_error: Exception | None = None

    @property
    def name(self) -> str:
        return self._inner.name

    @property
    def capabilities(self) -> Capabilities:
        return dataclasses.replace(self._inner.capabilities, link_terms=TESTBED_LINK_TERMS)

    def run(
        self,
        plan: Plan,
        iteration: int,
        faults: IterationFaults,
        *,
        digest: bool = False,
        checkpoint: bool = False,
    ) -> Outcome:
        if _static_delays(plan.profile) != _static_delays(self.profile):
            raise ConfigError(
                "--inject network takes the profile's delays (PP and DP) for the whole run; "
                "put changing delays in a fault timeline"
            )
        self._place(plan.topology or plan.profile.topology)
        network = _network(faults, self._base, iteration)
        for pair in sorted(set(network.wires) | set(self._wires)):
            unwired = _unwired(self._base, pair)
            changes = network.wires.get(pair, unwired)
            steady, lasting = len(changes) == 1, _lasting(changes)
            if lasting and self._wires.get(pair, unwired) == changes:
                continue  # in force already
            _, forward, backward = changes[0]
            self.bed.set_wire(
                *pair, plane=0, forward=forward, backward=backward, scheduled=not steady
            )
            self._wires[pair] = changes if lasting else ()  # (): set it again next time
        # The repaired NICs up before the new failures go down: a host whose rnic0 comes back
        # as its rnic1 fails would have none for a moment, and its delegates no NIC to move to.
        for host, plane in sorted(_nics_up(self._nics_down, network)):
            self.bed.set_link(host, plane, up=True)
            self._nics_down.discard((host, plane))
        for (host, plane), (outage, *_) in network.nics_down.items():  # after the wires: a
            if outage.from_ms == 0.0 and (host, plane) not in self._nics_down:  # new one too
                self._nics_down.add((host, plane))
                self.bed.set_link(host, plane, up=False)
        self._pending, self._started_at, self._timer_error = network, None, None
        self._iteration = iteration
        quiet = dataclasses.replace(plan, profile=plan.profile.with_delays((), ()))
        try:
            outcome = self._inner.run(
                quiet, iteration, NO_FAULTS, digest=digest, checkpoint=checkpoint
            )
        except WorkerError as err:
            if not (network.fails and _gloo_gave_up(err)):
                raise
            started = self._started_at
            noticed_s = time.monotonic() if err.noticed_s is None else err.noticed_s
            at_ms = None if started is None else (noticed_s - started) * 1000.0
            raise LinkFailure(
                f"iteration {iteration}: a failed NIC or link on the testbed: {err}", at_ms=at_ms
            ) from err
        finally:
            while self._timers:  # a timer that takes a NIC down may add its repair's
                timer = self._timers.pop(0)
                timer.cancel()
                timer.join()
        if self._timer_error is not None:
            raise TestbedError(
                f"iteration {iteration}: a NIC could not be taken down or brought up: "
                f"{self._timer_error}"
            ) from self._timer_error
        try:
            self.bed.check_wires()
        except TestbedError as err:
            raise TestbedError(f"iteration {iteration}: {err}") from err
        return outcome

    def _place(self, topology: Topology) -> None:
        """Each pair's base (caps on every data NIC, the delay on rnic1 and up) for the roles
        the pairs play under `topology`: a pair that changed role gets its new one's, a pair
        left with none is uncapped. rnic0's wires take their base in `run`."""
        base = _base_states(self.profile, topology)
        for pair in sorted(set(base) | set(self._base)):
            old, new = self._base.get(pair, HEALTHY), base.get(pair, HEALTHY)
            if old.rate_bit_s != new.rate_bit_s:
                for plane in range(len(DATA_PLANES)):
                    for src, dst in (pair, pair[::-1]):
                        if new.rate_bit_s is None:
                            self.bed.uncap_bandwidth(src, dst, plane=plane)
                        else:
                            rate_mbit = new.rate_bit_s / 1e6
                            self.bed.cap_bandwidth(src, dst, plane=plane, rate_mbit=rate_mbit)
            if old != new and (new.delay_ms or pair in self._wired):  # rnic0: `run`
                for plane in range(1, len(DATA_PLANES)):
                    self.bed.set_wire(*pair, plane=plane, forward=new)
                self._wired.add(pair)  # a wire's state rules its pair's traffic from now on
        self._base = base

    def _start(self, start_at: float) -> None:
        """The iteration's start is known: its changes inside the iteration go out."""
        self._started_at = start_at
        network, self._pending = self._pending, None
        if network is None:
            return
        for pair, changes in network.wires.items():
            for from_ms, forward, backward in changes[1:]:
                at = start_at + from_ms / 1000.0
                self.bed.set_wire(*pair, plane=0, forward=forward, backward=backward, at=at)
        for (host, plane), outages in network.nics_down.items():
            if outages[0].from_ms > 0.0 and (host, plane) not in self._nics_down:
                self._at(outages[0].from_ms, self._take_down, host, plane, outages)
            else:
                self._repair(host, plane, outages)

    def _at(self, offset_ms: float, do: Callable[..., None], *args: object) -> None:
        """`do(*args)` by a timer, `offset_ms` into the iteration (unless it ends first: `run`
        cancels the timers left)."""
        assert self._started_at is not None
        delay_s = max(0.0, self._started_at + offset_ms / 1000.0 - time.monotonic())
        timer = threading.Timer(delay_s, do, args)
        timer.start()
        self._timers.append(timer)

    def _take_down(self, host: int, plane: int, outages: tuple[_Outage, ...]) -> None:
        """A timer's: the NIC down at the offset of `outages[0]`, and its repair timed after
        that where the iteration has one (an error is raised again by `run`)."""
        self._nics_down.add((host, plane))  # first: a restart repairs it even half-done
        try:
            down_at = self.bed.set_link(host, plane, up=False)
        except Exception as err:  # kept: `run` raises it in the controller's thread
            self._timer_error = err
            return
        self._note(host, plane, down_at, up=False)
        self._repair(host, plane, outages)

    def _repair(self, host: int, plane: int, outages: tuple[_Outage, ...]) -> None:
        """The repair of a NIC down in `outages[0]` timed where the iteration has one; the
        next outage's failure is timed by it (one after the other, in their order)."""
        if outages[0].until_ms < math.inf:
            self._at(outages[0].until_ms, self._bring_up, host, plane, outages[1:])

    def _bring_up(self, host: int, plane: int, later: tuple[_Outage, ...]) -> None:
        """A timer's: the NIC repaired at its offset, and its failure at the first of the
        `later` outages timed."""
        try:
            up_at = self.bed.set_link(host, plane, up=True)
        except Exception as err:
            self._timer_error = err
            return
        self._nics_down.discard((host, plane))
        self._note(host, plane, up_at, up=True)
        if later:
            self._at(later[0].from_ms, self._take_down, host, plane, later)

    def _note(self, host: int, plane: int, set_at: float, *, up: bool) -> None:
        assert self._started_at is not None
        at_ms = (set_at - self._started_at) * 1000.0
        self.nic_changes.append(NicChange(self._iteration, host, plane, at_ms, up))

    def restart(self) -> None:
        """The failed hardware replaced: every NIC up, every wire at its base, the hosts'
        neighbour entries forgotten (an outage left some unresolved, which the fresh pool's
        first connects met); a fresh pool."""
        for host, plane in sorted(self._nics_down):
            self.bed.set_link(host, plane, up=True)
        self._nics_down.clear()
        for pair in sorted(self._wires):
            state = self._base.get(pair, HEALTHY)
            self.bed.set_wire(*pair, plane=0, forward=state, backward=state)
            self._wires[pair] = ((0.0, state, state),)
        self.bed.forget_neighbours()
        self._inner.restart()

    def close(self) -> None:
        self._inner.close()


@contextlib.contextmanager
def network_engine(
    profile: Profile,
    *,
    transport_timeout_s: float = 60.0,
    delegated: bool = False,
    notices: bool = True,
    longest_hold_ms: float = 0.0,
    model: str | None = None,
    seed: int = 0,
) -> Iterator[Engine]:
    """A testbed of one host per worker (stage and replica), htb caps for the profile's link
    bandwidths, and the engine that sets its wires and NICs at each iteration boundary
    (`model`: megatron's, None for the emulated backend, `seed` its initial weights and data;
    `delegated`: with delegates on the hosts; `notices`: see _NetworkEngine)."""
    with (
        Testbed(profile.topology.num_hosts) as bed,
        _NetworkEngine(
            bed, profile, transport_timeout_s, delegated, notices, longest_hold_ms, model, seed
        ) as engine,
    ):
        yield engine
