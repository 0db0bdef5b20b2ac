"""The simulated step against the plan's closed-form prediction."""

from __future__ import annotations

from rich.console import Group, RenderableType

from planner.plan.schema import Plan
from planner.report.bands import band_line, with_band
from planner.report.tables import plan_summary
from planner.report.width import Clauses, Prose, keep_whole, light_table
from planner.simulate.events import Simulation, closed_form_in_flight


def simulation_json(plan: Plan, sim: Simulation) -> dict[str, object]:
    """The ``planner simulate --json`` object: the simulated step beside the plan's closed
    form with its error band (None: a plan written before bands), and per stage the busy and
    idle seconds and the activations held at the peak, in microbatches' worth (a chunk is
    ``1/v`` of one)."""
    closed = closed_form_in_flight(plan)
    band = plan.predicted.error_band
    return {
        "simulated_step_s": sim.step_s,
        "predicted_step_s": plan.predicted.step_time_s,
        "predicted_error_band": band.model_dump(mode="json") if band is not None else None,
        "simulated_bubble_fraction": sim.bubble_fraction,
        "predicted_bubble_fraction": plan.predicted.bubble_fraction,
        "stages": [
            {
                "stage": i,
                "busy_s": sim.busy_s[i],
                "idle_s": sim.bubble_s[i],
                "peak_in_flight": sim.peak_in_flight[i],
                "closed_form_in_flight": closed[i],
            }
            for i in range(sim.num_stages)
        ],
    }


def simulation_tables(plan: Plan, sim: Simulation) -> list[RenderableType]:
    """The simulated step against the plan's prediction, and a row per stage."""
    data = simulation_json(plan, sim)
    predicted, band = plan.predicted.step_time_s, plan.predicted.error_band
    head = Group(
        plan_summary(plan, style="bold"),
        Clauses([f"simulated step {sim.step_s:.3f} s ({100 * (sim.step_s / predicted - 1):+.2f}"
                 f" %), predicted {with_band(predicted, band)}",
                 f"bubble simulated {100 * sim.bubble_fraction:.1f} %, predicted "
                 f"{100 * plan.predicted.bubble_fraction:.1f} %",
                 f"{len(sim.events):,} operations"], sep="; "),
        Prose(band_line(band)),
    )  # fmt: skip
    v = sim.virtual_stages
    table = light_table("stages")
    for col in ("stage", "busy s", "idle s", "in flight (simulated)", "in flight (closed form)"):
        table.add_column(col, justify="right", no_wrap=True)
    for row in data["stages"]:  # type: ignore[attr-defined]
        held = (row["peak_in_flight"], row["closed_form_in_flight"])
        table.add_row(str(row["stage"]), f"{row['busy_s']:.3f}", f"{row['idle_s']:.3f}",
                      *(f"{chunks_in_flight(x, v)}" for x in held))  # fmt: skip
    overlap = plan.flags.overlap_moe_expert_parallel_comm
    return [head, Prose(in_flight_meaning(v, overlap_moe_comm=overlap)), keep_whole(table)]


def chunks_in_flight(microbatches: float, virtual_stages: int) -> int:
    """Model chunks held, from microbatches' worth of activations (``1/v`` each): a whole
    number, which ``18.1667`` microbatches' worth (109 chunks of 6) does not read as."""
    return round(microbatches * virtual_stages)


def in_flight_meaning(virtual_stages: int, *, overlap_moe_comm: bool = False) -> str:
    """What the in-flight columns count, and why they differ by a chunk where the experts'
    all-to-alls are overlapped."""
    what = ("in flight: microbatches held at a stage's peak" if virtual_stages == 1 else
            f"in flight: model chunks held at a stage's peak, {virtual_stages} a microbatch")
    if overlap_moe_comm:
        what += ("; the closed form, the memory's, holds one chunk more: with the experts' "
                 "all-to-alls overlapped, combined 1F1B runs the next forward before the "
                 "backward it pairs with frees its chunk, a schedule the simulator does not run")
    return what
