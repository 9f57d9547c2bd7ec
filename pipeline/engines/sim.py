"""The `sim` engine: the event-driven simulator, one iteration after another on one clock.
A change of placement (a rank swap) starts its iteration with the swap, timed by the cost
model (`_swap_records`). As in the runtimes, the processes start on the default placement,
also after a restart: a plan on another one swaps to it in its first iteration (moving no
state there, which comes from the initial one or a checkpoint)."""

from __future__ import annotations

from typing import Any

from pipeline.engines.base import Capabilities, Closing, Outcome, Plan
from pipeline.faults import IterationFaults, first_route_up
from pipeline.host_costs import FREE, HostCosts
from pipeline.link_terms import ALL_LINK_TERMS
from pipeline.profile import Profile
from pipeline.schedule import Schedule
from pipeline.simulator import CommMode, simulate
from pipeline.timeline import SwapRecord, Timeline
from pipeline.topology import Direction, Link, Topology

__all__ = ["SimEngine"]

_CACHED_ITERATIONS = 64
"""Distinct iterations kept for reuse (oldest dropped first): memory stays flat."""


class SimEngine(Closing):
    """Every DP replica of a plan's profile runs the pipeline, then each stage's all-reduce
    and optimizer step (the step time: pipeline.simulator). `host`: a host's runtime costs
    (a calibration); `delays_in_network`: time the delays and caps as a network does (a
    run with `--inject network`), not as the fault hook's sleep before each send
    (`pipeline.simulator.simulate`)."""

    name = "sim"
    capabilities = Capabilities(comms=frozenset(CommMode), link_terms=ALL_LINK_TERMS, restarts=True)

    def __init__(self, *, host: HostCosts = FREE, delays_in_network: bool = False) -> None:
        self.host = host
        self.delays_in_network = delays_in_network
        self._clock_ms = 0.0
        self._nics_in_use: dict[tuple[int, str, str], int] = {}
        """The NIC (by index) of each (replica, link, direction) whose delegates are off the
        first (a failover moved them, or a rank swap's new pair started there): until a
        restart, or a rank swap that gives the direction another worker at either end."""
        self._validated: dict[int, Schedule] = {}
        self._cache: dict[tuple[Any, ...], tuple[Plan, Timeline, int]] = {}
        self._placement: Topology | None = None
        """The placement the last iteration ran (None: the default one, where the processes
        start)."""
        self._restarted = False
        """A restart came after the last iteration (its state comes from a checkpoint)."""

    def run(
        self,
        plan: Plan,
        iteration: int,
        faults: IterationFaults,
        *,
        digest: bool = False,
        checkpoint: bool = False,
    ) -> Outcome:
        """An iteration whose plan and faults equal an earlier one's of this run (faults'
        `cache_key`) is that iteration again, moved to now (`Outcome.same_as`). Iteration 0
        starts a new run at time 0, its processes on the default placement with no NIC
        moved and no earlier iteration to repeat, unless a restart came just before it: then
        the run goes on back at its start, its clock too."""
        restarted, self._restarted = self._restarted, False
        if iteration == 0 and not restarted:
            self._clock_ms = 0.0
            self._nics_in_use.clear()
            self._placement = None
            self._cache.clear()  # `same_as` names an iteration of this run
        placement = plan.topology or plan.profile.topology
        before = self._placement
        shape = (placement.num_stages, placement.num_replicas)
        if before is None or (before.num_stages, before.num_replicas) != shape:
            before = plan.profile.topology  # fresh processes (another shape: another job's)
        self._placement = placement
        swaps: tuple[SwapRecord, ...] = ()
        if before.workers != placement.workers:
            self._nics_in_use = _nics_after_swap(
                self._nics_in_use, before, placement, faults, len(placement.nics)
            )
            swaps = _swap_records(
                plan.profile,
                before,
                placement,
                iteration,
                self._clock_ms,
                moves_state=iteration > 0 and not restarted,
            )
        iteration_start_ms = self._clock_ms
        if swaps:
            self._clock_ms = max(r.end_ms for r in swaps)
        faults_key = faults.cache_key()
        # A swap's iteration is its own: no later one repeats it (nor its metrics).
        in_use = frozenset(self._nics_in_use.items())
        key = None if faults_key is None or swaps else (plan, faults_key, in_use)
        cached = None if key is None else self._cache.get(key)
        if cached is not None:
            timeline = cached[1].moved(iteration, self._clock_ms)
            same_as: int | None = cached[2]
        else:
            plan.validate(self._validated)
            timeline = simulate(
                plan.schedule,
                plan.iteration_profile(),
                plan.comm,
                iteration=iteration,
                start_ms=self._clock_ms,
                validate=False,
                host=self.host,
                faults=faults,
                link_comms=plan.link_comms,
                nics_in_use=self._nics_in_use,
                replica_schedules=plan.replica_schedules,
                faults_from_ms=iteration_start_ms,  # a swap's transfer is in the iteration
                delays_in_network=self.delays_in_network,
            )
            same_as = None
            if key is not None:
                if len(self._cache) >= _CACHED_ITERATIONS:
                    self._cache.pop(next(iter(self._cache)))
                self._cache[key] = (plan, timeline, iteration)
        if swaps:  # the iteration starts with its swap: its time is in the iteration's
            (record,) = timeline.iterations
            timeline = Timeline(
                timeline.num_stages,
                timeline.ops,
                timeline.messages,
                (record._replace(start_ms=iteration_start_ms),),
                timeline.failovers,
                timeline.dp_messages,
                swaps,
            )
        self._clock_ms = timeline.iterations[0].end_ms
        nics = plan.profile.topology.nics
        for failover in timeline.failovers:  # in order: the last move of a direction holds
            nic = nics.index(failover.nic_to)
            direction = (failover.replica, failover.link, failover.direction)
            if nic:
                self._nics_in_use[direction] = nic
            else:
                self._nics_in_use.pop(direction, None)
        return Outcome(timeline, same_as=same_as)

    def restart(self) -> None:
        """Nothing to restart but the NICs: the clock goes on, on repaired hardware (whose
        processes start on the default placement: the next iteration swaps from it where its
        plan has another). The cache goes too: the iterations it names run again after the
        restart, so an `Outcome.same_as` into it could name a run of the same index with
        other faults."""
        self._nics_in_use.clear()
        self._placement, self._restarted = None, True
        self._cache.clear()

    def close(self) -> None:
        self._validated.clear()
        self._cache.clear()


def _swap_records(
    profile: Profile,
    before: Topology,
    after: Topology,
    iteration: int,
    start_ms: float,
    *,
    moves_state: bool = True,
) -> tuple[SwapRecord, ...]:
    """A rank swap as the runtimes make it, timed by the cost model: every worker that plays
    another position sends the left one's training state (`Profile.state_bytes`) to its new
    player over a DP link and takes its new one's, all at once; the swap lasts as long as
    the largest transfer (`Profile.dp_wire_ms`). Without `moves_state` (the first iteration
    of a run or after a restart: every position's state comes from the initial one or a
    checkpoint) the movers send nothing."""
    moves = []
    for index in range(after.num_positions):
        position = after.position(index)
        worker = after.worker(position)
        left = before.position_of_worker(worker)
        if left != position:
            moves.append((left, position, profile.state_bytes(left.stage) if moves_state else 0))
    end_ms = start_ms + max(profile.dp_wire_ms(num_bytes) for _, _, num_bytes in moves)
    return tuple(
        SwapRecord(
            iteration,
            0,
            left.stage,
            left.replica,
            to.stage,
            to.replica,
            num_bytes,
            start_ms,
            end_ms,
        )
        for left, to, num_bytes in moves
    )


def _nics_after_swap(
    nics_in_use: dict[tuple[int, str, str], int],
    before: Topology,
    after: Topology,
    faults: IterationFaults,
    num_nics: int,
) -> dict[tuple[int, str, str], int]:
    """`nics_in_use` after a rank swap from `before` to `after`, at the start of the
    iteration under `faults`: a link direction with the same workers at both ends keeps its
    delegates and their NIC (as the runtimes rewire); one with another worker at either end
    gets a new pair, which starts on the first NIC whose route is up (`first_route_up`, as
    the runtimes' delegates do: no failover)."""

    def ends(topology: Topology, link: Link) -> tuple[int, ...]:
        return tuple(topology.worker(position) for position in topology.ends(link))

    pp = [
        (str(Link.pp(i)), Link.pp(i, r))
        for r in range(after.num_replicas)
        for i in range(after.num_stages - 1)
    ]
    dp = [(str(link), link) for stage in range(after.num_stages) for link in after.dp_ring(stage)]
    on_nic: dict[tuple[int, str, str], int] = {}
    for name, link in pp + dp:
        new_pair = ends(before, link) != ends(after, link)
        nic = first_route_up(faults, link, num_nics) if new_pair else None
        for direction in Direction:
            key = (link.sender(direction).replica, name, direction)
            start = nics_in_use.get(key, 0) if nic is None else nic
            if start:
                on_nic[key] = start
    return on_nic
