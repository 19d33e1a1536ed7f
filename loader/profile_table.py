"""A profile as text: the stages where they run, the placements, what was measured, and the recommendation."""
from __future__ import annotations

import math

from .placement.units import format_bytes, text_columns


def number(value) -> str:
    """Whole numbers with thousands separators from 1,000, three significant digits below; '-' for none."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def format_profile(p) -> str:
    place = p.placement
    threads = f"{place['threads']} thread{'s' if place['threads'] != 1 else ''}"
    chosen = ", chosen by auto" if place.get("chosen_by") == "auto" else ""
    lines = [f"{p.pipeline}: batch {p.batch_size:,}, placement {place['placement']} (cut {place['cut']}{chosen}), "
             f"{threads}, prefetch {place['prefetch']}, on {p.device}", ""]
    rows = [("stage", "where", "us/sample", "ms/batch", "share", "bytes out/sample")]
    for s in p.stages:
        ms = s["ms_per_sample"]
        rows.append((s["stage"], s["backend"], number(1000 * ms), number(ms * p.batch_size), f"{s['share']:.0%}",
                     format_bytes(s["bytes_out_per_sample"]) if s["backend"] != "pcie" else ""))
    lines += text_columns(rows, {2, 3, 4})
    c = p.batch_costs
    if c:
        lines += ["", f"per batch   forming {number(c['forming_ms'])} ms of cores beyond the stages, the batch thread "
                      f"{number(c['batch_thread_ms'])} ms, the hand-off {number(c['hand_off_ms'])} ms, copies "
                      f"{number(c['copies_ms'])} ms (in the predictions, over the batch size)"]
    b = p.bottleneck
    lines += ["", f"bottleneck  {b['stage']} on the {b['resource']}: {b['share']:.0%} of the time, "
                  f"{number(1000 * b['ms_per_sample'])} us per sample", ""]
    rows = [("placement", "threads", "predicted samples/s", "measured samples/s", "bound by")]
    for r in p.placements:
        name = r["placement"] + (" (current)" if r["current"] else "")
        if r["predicted_samples_per_s"] is None:
            rows.append((name, "-", r["why_not"] or "-", number(r["measured_samples_per_s"]), "-"))
        else:
            rows.append((name, str(r["threads"]), number(r["predicted_samples_per_s"]),
                         number(r["measured_samples_per_s"]), r["bound_by"]))
    lines += text_columns(rows, {1, 3})
    m = p.measured
    lines += ["", f"capacity    {number(m['capacity_samples_per_s'])} samples/s measured with no trainer "
                  f"({m['batches']} batches), {number(m['predicted_samples_per_s'])} predicted"]
    if m["delivered_samples_per_s"] is not None:
        lines.append(f"trainer     step {number(m['trainer_step_ms'])} ms: {number(m['delivered_samples_per_s'])} "
                     f"samples/s delivered; the trainer waits {m['trainer_wait_share']:.0%} of its time "
                     f"({number(m['mean_wait_ms'])} ms when it waits); {m['queued_share']:.0%} of batches were "
                     f"queued when it asked")
        lines.append(f"headroom    {number(p.headroom_samples_per_s)} samples/s: the trainer loop on batches "
                     f"already made (the most the loader could deliver to it)")
    else:
        lines.append("headroom    needs a trainer step (trainer_step_ms, train_step; --trainer-step-ms)")
    r = p.recommendation
    lines.append(f"recommend   {r['words']}{_gain(r)}")
    lines += [f"or          {a['words']}{_gain(a)}" for a in r.get("alternatives", [])]
    lines += [f"note        {n}" for n in p.notes]
    return "\n".join(lines)


def _gain(option: dict) -> str:
    if option["action"] == "none":
        return ""
    return f" ({'up to ' if option['bound'] else ''}x{option['predicted_gain']:.2f} predicted)"
