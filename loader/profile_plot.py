"""A profile as a picture (matplotlib, the ``plot`` extra): each placement's stage times stacked, and the timeline
of the batches the trainer took (waited for, or already queued) and of its steps."""
from __future__ import annotations

from pathlib import Path

PLOT_EXTRA = "pip install 'feedline[plot]'"


def plot_profile(profile, path: Path) -> Path:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError(f"the profile's picture needs matplotlib: {PLOT_EXTRA}") from None
    if not path.parent.is_dir():
        raise FileNotFoundError(f"cannot write {str(path)!r}: folder {str(path.parent)!r} does not exist")
    fig, (stacks, timeline) = plt.subplots(2, 1, figsize=(10, 7.5), gridspec_kw={"height_ratios": [1, 1.2]})
    try:
        _stacks(stacks, profile)
        _timeline(timeline, profile)
        fig.suptitle(f"{profile.pipeline}, batch {profile.batch_size}: where the time goes")
        fig.tight_layout()
        fig.savefig(path, dpi=100)
    finally:
        plt.close(fig)
    return path


def _stacks(ax, profile) -> None:
    """One bar per placement that can run: each stage's ms per batch where it runs there, stacked."""
    rows = [r for r in profile.placements if r["stage_ms_per_sample"] is not None]
    names = list(dict.fromkeys(k for r in rows for k in r["stage_ms_per_sample"]))
    colors = {name: f"C{i % 10}" for i, name in enumerate(names)}
    labels = []
    for y, r in enumerate(rows):
        left = 0.0
        for name in names:
            width = r["stage_ms_per_sample"].get(name, 0.0) * profile.batch_size
            if width <= 0:
                continue
            ax.barh(y, width, left=left, color=colors[name], label=name if name not in labels else None)
            labels.append(name)
            left += width
        predicted = r["predicted_samples_per_s"]
        ax.text(left, y, f"  {predicted:,.0f} samples/s predicted, {r['threads']} threads", va="center", fontsize=8)
    ax.set_yticks(range(len(rows)), [r["placement"] + (" (current)" if r["current"] else "") for r in rows])
    ax.set_xlabel("ms per batch (CPU stages: one thread's time; GPU stages: synchronised time)")
    ax.set_title("stage time per placement")
    ax.legend(fontsize=8, loc="lower right")
    ax.margins(x=0.35)


def _timeline(ax, profile) -> None:
    """Per batch: the trainer waiting for it, or taking it from the queue, then its step."""
    waits = [(asked, got - asked) for asked, got, _ in profile.timeline]
    steps = [(got, done - got) for _, got, done in profile.timeline if done > got]
    ax.broken_barh(waits, (1.6, 0.8), color="tab:red", label="trainer waits for a batch")
    if steps:
        ax.broken_barh(steps, (0.6, 0.8), color="tab:gray", label="trainer step")
    got = [g for _, g, _ in profile.timeline]
    ready = [g for a, g, _ in profile.timeline if g - a < 0.001]
    late = [g for a, g, _ in profile.timeline if g - a >= 0.001]
    ax.plot(ready, [2.9] * len(ready), "v", color="tab:green", label="batch taken from the queue")
    ax.plot(late, [2.9] * len(late), "v", color="tab:red", label="batch waited for", alpha=0.6)
    ax.step(got, [3.3 + 0.8 * (i + 1) / max(len(got), 1) for i in range(len(got))], where="post", color="tab:blue",
            label="batches delivered (cumulative)")
    ax.set_yticks([1.0, 2.0, 2.9], ["step", "wait", "batch"])
    ax.set_xlabel("seconds")
    step = profile.measured.get("trainer_step_ms")
    ax.set_title("timeline" + (f" under a trainer step of {step:.3g} ms" if step else " with no trainer"))
    ax.legend(fontsize=8, loc="upper left", ncol=3)
    ax.set_ylim(0.4, 5.0)
