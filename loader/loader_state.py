"""A Loader's state as the composition of its parts' (the cursor's position, the order's resizes and a mix's
weights, the skip log, the configuration a resume must match), and the way back: the saved states read into
where a Loader resumes (``resume``)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .cursor import Cursor
from .mix_order import MixOrder
from .remainder import plain, resizes
from .resume import Resume, checked, resumed
from .sampler import STATE_VERSION, Order
from .skip_log import SkipLog


def composed(cursor: Cursor, order: Order, skips: SkipLog, config: Mapping[str, Any]) -> dict[str, Any]:
    """The state of a Loader running ``order`` (``saved_state.configuration``: ``config``) at ``cursor``. The
    position is read first, so the skips listed include every one met before it."""
    position, own = cursor.state(), plain(order)
    return {"version": STATE_VERSION, **position, "resizes": resizes(order, position["epoch"]),
            "skipped": [[k.where, k.reason, k.index, k.epoch] for k in list(skips.skipped)],
            "config": config,
            **({"mix": own.state()} if isinstance(own, MixOrder) else {})}


def resume_from(state: Mapping[str, Any] | list[Mapping[str, Any]], order: Order,
                config: Mapping[str, Any]) -> Resume:
    """Where a Loader running ``order`` with ``config`` resumes from ``state``: one rank's, or the list of every
    rank's of a job (``resume.checked``); a mix's weights are loaded into its order first."""
    own = plain(order)
    states = checked(state, own, config)
    if isinstance(own, MixOrder):  # (first: an epoch's length can follow its weights)
        own.load(states[0].get("mix", {}))
    return resumed(states, own)
