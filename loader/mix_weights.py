"""Where a Loader finds its mix's weights: its order's own ``MixOrder`` (behind a resume on another number of
ranks, the order that job runs), and whether new weights may start at the trainer's next sample."""
from __future__ import annotations

from .mix_order import MixOrder
from .remainder import plain
from .sampler import Order


def weights_of(order: Order, pipeline_name: str) -> dict[str, float]:
    """The mix's weights now (normalised), by source name."""
    own = plain(order)
    if not isinstance(own, MixOrder):
        raise TypeError(f"pipeline {pipeline_name!r} is not a mix (feedline.pipelines.mix): it has no weights")
    return own.weights


def order_to_reweigh(order: Order, pipeline_name: str, epoch: int) -> MixOrder:
    """The ``MixOrder`` whose weights may change from a place of ``epoch`` on: not in the rest of an epoch dealt
    to this job's ranks after a resume on another number of ranks (its places were drawn by the earlier job)."""
    own = plain(order)
    if not isinstance(own, MixOrder):
        raise TypeError(f"set_weights: pipeline {pipeline_name!r} is not a mix (feedline.pipelines.mix)")
    if own is not order and epoch == order.at:
        raise ValueError(f"set_weights: the rest of epoch {epoch} was dealt to this job's ranks after a resume on "
                         f"another number of ranks, in the places the earlier job drew; new weights can start "
                         f"with the next epoch (call set_weights after this epoch's last batch)")
    return own
