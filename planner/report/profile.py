"""``planner profile``'s table: each layer measured, and how far the cost model's own price of
it was (the factor pricing then applies)."""

from __future__ import annotations

from rich.console import RenderableType

from planner.report.width import light_table
from planner.spec.profile import LayerProfile, ProfileFactors
from planner.vocabulary import GIB

MIB = GIB / 1024


def _ratio(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.0f}" if value >= 100 else f"{value:.2f}"  # an unbenched device's: narrow


def profile_tables(profile: LayerProfile, factors: ProfileFactors | None) -> list[RenderableType]:
    """The measurements with their measured-over-priced factors, then what was skipped."""
    table = light_table(f"{profile.model} on {profile.device_reported or profile.device} "
                        f"({profile.stack}, {profile.precision})")  # fmt: skip
    for name in ("layer", "fwd ms", "bwd ms", "kept MiB", "x fwd", "x bwd", "x kept"):
        table.add_column(name, justify="left" if name == "layer" else "right")
    by_shape = {(f.kind, f.tensor_parallel, f.expert_parallel, f.micro_batch_size,
                 f.seq_length): f for f in (factors.layers if factors else ())}  # fmt: skip
    for m in profile.measured:
        f = by_shape.get((m.kind, m.tensor_parallel, m.expert_parallel, m.micro_batch_size,
                          m.seq_length))  # fmt: skip
        forward = "-" if m.forward_s is None else f"{m.forward_s * 1e3:.3f}"
        backward = "-" if m.backward_s is None else f"{m.backward_s * 1e3:.3f}"
        kept = "-" if m.kept_bytes is None else f"{m.kept_bytes / MIB:.1f}"
        table.add_row(m.label(), forward, backward, kept,
                      _ratio(f and f.forward), _ratio(f and f.backward),
                      _ratio(f and f.kept))  # fmt: skip
    out: list[RenderableType] = [table, "x: measured over the cost model's price of the same "
                                 "shard; plans priced with --profile use the measurement"]
    if profile.optimizer is not None:
        ratio = "" if factors is None or factors.optimizer is None else (
            f", x {factors.optimizer:.2f}")
        out.append(f"optimizer: AdamW over {profile.optimizer.parameters:,} parameters (a "
                   f"layer's) in {profile.optimizer.step_s * 1e3:.3f} ms{ratio}")
    out += [f"not measured: {s.label()}: {s.reason}" for s in profile.skipped]
    return out
