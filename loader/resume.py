"""Reading saved Loader states into where a Loader resumes: its own rank's state, or the states of a job of
another size (``remainder.ResumedOrder`` deals the rest of the epoch to the new job's ranks).

A state holds its rank's position in its share of the epoch (``cursor``) and the jobs that ran the epoch before
(``resizes``: ``[world_size, stops]`` each, oldest first). Moving to another number of ranks needs every old
rank's position. Where the ranks step in lockstep, one state tells them all: every rank delivered as many batches
of the same size. Where ``on_error="skip"`` fills a batch past a bad sample from later ones
(``Order.skips_move_positions``), a rank can stand further on than its batches say, and only the states of every
rank tell where each stopped: pass them as a list (gathered, e.g., with ``torch.distributed.all_gather_object``).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import Skipped
from .remainder import ResumedOrder
from .sampler import READ_VERSIONS, Order
from .saved_state import check_resumable


@dataclass(frozen=True)
class Resume:
    """What a Loader takes from saved states: the order to run, the position for ``Cursor.load``, the skips."""

    order: Order
    position: Mapping[str, Any]
    skipped: list[Skipped]


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _checked(state: object, which: str) -> Mapping[str, Any]:
    if not isinstance(state, Mapping) or state.get("version") not in READ_VERSIONS:
        raise ValueError(f"{which} is not a feedline Loader state (version {' or '.join(map(str, READ_VERSIONS))}): "
                         f"{state.get('version') if isinstance(state, Mapping) else type(state).__name__}")
    config, resized = state.get("config"), state.get("resizes", [])
    if not isinstance(config, Mapping) or not _count(config.get("rank")) or not _count(config.get("world_size")):
        raise ValueError(f"{which} has no valid 'config' (rank and world_size)")
    epoch, position, cursor, complete = (state.get(k) for k in ("epoch", "position", "cursor", "complete"))
    if not (_count(epoch) and _count(position) and _count(cursor)) or not isinstance(complete, bool):
        raise ValueError(f"{which} has an invalid position: epoch={epoch!r}, position={position!r}, "
                         f"cursor={cursor!r}, complete={complete!r}")
    if not isinstance(resized, list) or any(
            not isinstance(r, (list, tuple)) or len(r) != 2 or not _count(r[0]) or r[0] == 0
            or not isinstance(r[1], (list, tuple)) or len(r[1]) != r[0] or not all(_count(k) for k in r[1])
            for r in resized):
        raise ValueError(f"{which} has an invalid 'resizes' list (each entry [world_size, [one position per "
                         f"rank]]): {resized!r}")
    return state


def _skips(states: Sequence[Mapping[str, Any]]) -> list[Skipped]:
    try:
        return [Skipped(*entry) for state in states for entry in state.get("skipped", [])]
    except TypeError:
        raise ValueError("state has an invalid 'skipped' list") from None


def order_of(order: Order, resizes: list, epoch: int) -> Order:
    """``order`` (a rank's, in its own job) in epoch ``epoch`` after the jobs ``resizes`` ran it."""
    if not resizes:
        return order
    earlier = order.for_rank(0, resizes[0][0])
    for k, (_, stops) in enumerate(resizes):
        base = order if k == len(resizes) - 1 else order.for_rank(0, resizes[k + 1][0])
        earlier = ResumedOrder(base, earlier, epoch, stops)
    return earlier


def _one_job(states: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The states of every rank of one job, in rank order: or a ValueError saying what is wrong with them."""
    world = states[0]["config"]["world_size"]
    ranks = [s["config"]["rank"] for s in states]
    twice = sorted({r for r in ranks if ranks.count(r) > 1})
    if twice:
        raise ValueError(f"the states hold rank(s) {twice} more than once: pass one state per rank")
    missing = sorted(set(range(world)) - set(ranks))
    if missing or len(states) != world:
        raise ValueError(f"the states come from a job of {world} rank(s) and lack rank(s) {missing}: pass the "
                         f"state of every rank (e.g. gathered with torch.distributed.all_gather_object)")
    ordered = sorted(states, key=lambda s: s["config"]["rank"])
    first = ordered[0]
    for state in ordered[1:]:
        rank = state["config"]["rank"]
        differ = [k for k in set(first["config"]) | set(state["config"])
                  if k != "rank" and first["config"].get(k) != state["config"].get(k)]
        if differ:
            raise ValueError(f"the states of rank 0 and rank {rank} come from differently configured Loaders "
                             f"({', '.join(sorted(differ))} differ): pass the states of one job")
        for key in sorted((set(first) | set(state)) - RANK_OWN):  # where the job stands, the same on every rank
            if state.get(key) != first.get(key):
                raise ValueError(f"the states of rank 0 and rank {rank} were not saved at the same step ({key}: "
                                 f"{first.get(key)!r} vs {state.get(key)!r}): pass the states every rank saved "
                                 f"after the same batch")
    return ordered


RANK_OWN = {"config", "cursor", "skipped"}  # what the states of one job's ranks may hold differently


def checked(given: Mapping[str, Any] | Sequence[Mapping[str, Any]], order: Order,
            mine: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """``given`` (a state, or the list of the states of every rank of a job) checked against a Loader whose own
    epochs are ``order`` and whose configuration is ``mine``: the states, in rank order."""
    if isinstance(given, Sequence) and not isinstance(given, (str, bytes)):
        if not given:
            raise ValueError("load_state_dict was given an empty list of states")
        states = _one_job([_checked(s, f"item {k} of the list") for k, s in enumerate(given)])
    else:
        states = [_checked(given, "the state")]
    world = states[0]["config"]["world_size"]
    if world == order.world_size:
        check_resumable(next((s for s in states if s["config"]["rank"] == order.rank), states[0])["config"], mine)
    else:
        check_resumable(states[0]["config"], mine, resize=True)
    return states


def resumed(states: list[Mapping[str, Any]], order: Order) -> Resume:
    """Where a Loader whose own epochs are ``order`` resumes from ``checked`` states."""
    first = states[0]
    world, epoch = first["config"]["world_size"], first["epoch"]
    if world == order.world_size:
        own = next(s for s in states if s["config"]["rank"] == order.rank)
        return Resume(order_of(order, own.get("resizes", []), epoch), own, _skips([own]))
    if first["complete"]:  # the next epoch is this job's own
        return Resume(order, {"epoch": epoch, "position": 0, "cursor": 0, "complete": True}, _skips(states))
    if len(states) == 1:
        lockstep = first["config"].get("on_error") != "skip" or not order.skips_move_positions \
            or (first["position"] == 0 and first["cursor"] == 0)
        if not lockstep:
            raise ValueError(
                f"cannot resume a job of {world} rank(s) on {order.world_size} from one rank's state: with "
                f"on_error='skip' a rank fills a batch past a skipped sample from later ones, so each rank of the old "
                f"job may stand elsewhere in the epoch. Pass the states of all {world} ranks as a list (gather them "
                f"when saving, e.g. with torch.distributed.all_gather_object)")
        stops = [first["cursor"]] * world
    else:
        stops = [s["cursor"] for s in states]
    if not any(stops) and not first.get("resizes"):  # nothing of the epoch delivered yet: it is this job's own
        return Resume(order, {"epoch": epoch, "position": 0, "cursor": 0, "complete": False}, _skips(states))
    before = order_of(order.for_rank(0, world), first.get("resizes", []), epoch)
    rest = ResumedOrder(order, before, epoch, stops)
    return Resume(rest, {"epoch": epoch, "position": 0, "cursor": 0, "complete": rest.share == 0}, _skips(states))
