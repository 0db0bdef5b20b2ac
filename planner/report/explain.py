"""``planner explain``: an :class:`~planner.diagnose.explain.Explanation` as text and JSON.

The text answers a user's first question about a plan, "why this one?", in the order an
engineer asks it: which faster changes were ruled out and by what, what fills the memory and
where the step goes, each knob one notch either way, the plan on other hardware, and the
user's own configuration beside it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.console import Group, RenderableType

from planner.diagnose.explain import differences
from planner.diagnose.explanation import Explanation, Neighbour, Part
from planner.diagnose.notches import KNOBS, said
from planner.frameworks import ANY, profile
from planner.plan.schema import Plan
from planner.report.bands import band_line, inside, with_band
from planner.report.tables import plan_summary
from planner.report.width import FirstThatFits, Prose, keep_whole, light_table

_SEARCHED = {k.name: k.searched for k in KNOBS}


def _label(name: str) -> str:
    """A part's key as words: ``data_parallel_comm_exposed_s`` -> ``data parallel comm
    exposed``."""
    return name.removesuffix("_s").removesuffix("_gib").replace("_", " ")


def _who(plan: Plan) -> str:
    return "any framework" if plan.framework == ANY else profile(plan.framework).title


def verdict(n: Neighbour, plan: Plan) -> str:
    """``feasible``, ``over`` (the memory), ``refused`` (by the plan's framework) or ``not
    priced`` (estimate refuses it: degrees that do not divide, or what the run cannot have,
    such as a stack for the wrong model; the reasons are :func:`reasons`)."""
    if n.refusal is not None:
        return "not priced"
    words = []
    if not n.fits and n.over_gib is not None:
        words.append("over")
    if n.framework_refusals:
        words.append("refused")
    return ", ".join(words) or "feasible"


def reasons(n: Neighbour, plan: Plan) -> list[str]:
    """Why ``n`` does not divide, or why the framework refuses it, in their own words; for
    the plan on other hardware, that its reserve grew (a wider scale-up domain puts more of
    an all-to-all's peers inside it, each with NCCL's buffers)."""
    if n.refusal is not None:
        return [n.refusal]
    said = [f"{_who(plan)}: {reason}" for reason in n.framework_refusals]
    if n.knob == "plan" and n.memory is not None:
        busiest = max(plan.stages, key=lambda s: s.memory.total_gib).memory
        grown = n.memory.other_gib - busiest.other_gib
        if grown >= 0.5:
            said.append(f"its reserve (CUDA, NCCL's buffers, the allocator's cache) grows "
                        f"{grown:.1f} GiB: NCCL holds buffers for each all-to-all peer inside "
                        f"a scale-up domain")  # fmt: skip
    return said


def why_this_plan(e: Explanation, plan: Plan) -> list[str]:
    """The one-notch changes that would make the step faster, fastest first, each with what
    rules it out: memory, the framework, the search's options; or that none would."""
    if not e.sensitivities:
        return ["why this plan: " + "; ".join(e.limits)]
    faster = sorted((n for n in e.sensitivities if n.delta_s is not None and n.delta_s < 0),
                    key=lambda n: n.delta_s or 0.0)  # fmt: skip
    if not faster:
        return ["why this plan: no knob turned one notch either way makes the step faster"]
    lines = [f"why this plan: {len(faster)} one-notch change{'s' * (len(faster) > 1)} would "
             "make the step faster:"]  # fmt: skip
    for n in faster:
        ruled = _ruled_out(n, plan)
        # only a change that could be made needs its gain weighed against the band
        weighed = _significance(n, plan) if ruled.startswith("feasible") else ""
        lines.append(f"  {n.change}: {-(n.delta_s or 0.0):.3f} s faster{weighed}, {ruled}")
    return lines


def _ruled_out(n: Neighbour, plan: Plan) -> str:
    """What keeps a faster change out of the plan."""
    clauses = []
    if not n.fits and n.over_gib is not None:
        clauses.append(f"does not fit ({n.over_gib:.1f} GiB over)")
    if n.framework_refusals:
        # what the first rule names (``overlap_moe_expert_parallel_comm with tp_comm_overlap``):
        # the framework launches the knob, not beside what the rule says
        # (the rules' messages say what, then ": " and why; a long head is said in the table)
        first = n.framework_refusals[0].split(": ", 1)[0]
        more = len(n.framework_refusals) - 1
        named = f" ({first}{f' and {more} more' if more else ''})" if len(first) <= 80 else ""
        clauses.append(f"{_who(plan)} does not launch it{named}")
    if clauses:
        return " and ".join(clauses)
    if _unsearched(n, plan) == ["stack"]:  # a stack's switch: solve plans on the stack given
        return f"feasible; solve keeps the stack it is given (--stack {n.config.stack})"
    if _unsearched(n, plan) == ["tp_comm_overlap"]:  # a switch the search turns when let
        return "feasible; solve turns this knob only with --tp-comm-overlap"
    if _unsearched(n, plan):
        names = " and ".join(said(k, n.config.stack) for k in _unsearched(n, plan))
        return f"feasible; solve does not turn {'this knob' if n.knob in _SEARCHED else names}"
    if plan.solver.status == "priced":
        return "feasible (the plan was priced as given, not searched)"
    return f"feasible; outside the search's space, or missed (it ended {plan.solver.status})"


def _unsearched(n: Neighbour, plan: Plan) -> list[str]:
    """The knobs ``n`` changes from the plan's configuration that solve does not turn."""
    c = plan.configuration
    if c is None:
        return []
    return [name for name, searched in _SEARCHED.items()
            if not searched and getattr(n.config, name) != getattr(c, name)]  # fmt: skip


def _parts(parts: tuple[Part, ...], fmt: str, unit: str) -> str:
    return ", ".join(f"{_label(p.name)} {p.value:{fmt}}{unit}" for p in parts if p.value > 0)


def binding_lines(e: Explanation) -> list[str]:
    """What fills the most loaded stage's memory; where the step goes."""
    m = e.memory
    usable = m.capacity_gib - m.margin_gib
    room = f"{m.free_gib:.1f} GiB free" if m.free_gib >= 0 else f"{-m.free_gib:.1f} GiB over"
    memory = (f"memory: stage {m.stage} holds {m.peak_gib:.1f} GiB of the {usable:.1f} GiB it "
              f"may use ({m.capacity_gib:g} GiB less a {m.margin_gib:.1f} GiB margin), {room}: "
              f"{_parts(m.parts, '.1f', '')} GiB")  # fmt: skip
    top = e.step[0]
    overheads = [p for p in e.step if p is not top and p.value > 0][:3]
    step = (f"step: {_label(top.name)} {top.value:.3f} s of {e.step_time_s:.3f} s "
            f"({100 * top.share:.1f} %)")  # fmt: skip
    if overheads:
        step += "; then " + ", ".join(f"{_label(p.name)} {p.value:.3f} s ({100 * p.share:.1f} %)"
                                      for p in overheads)  # fmt: skip
    return [memory, step]


def _neighbour_table(heading: str, rows: list[tuple[str, Neighbour]],
                     plan: Plan) -> list[RenderableType]:  # fmt: skip
    """The changes priced, a row each: the step, its difference to the plan's, the memory it
    leaves free beside the margin (negative: over) and the verdict (each change on one line
    when the console is wide enough, else wrapped between its words); the reasons a change
    does not divide or is refused, numbered under the table."""
    notes: list[str] = []
    cells = []
    for change, n in rows:
        mark = ""
        for reason in reasons(n, plan):
            if reason not in notes:
                notes.append(reason)
            mark += f" [{notes.index(reason) + 1}]"
        if n.step_time_s is None or n.delta_s is None or n.over_gib is None:
            cells.append((change, "-", "-", "-", verdict(n, plan) + mark))
            continue
        cells.append((change, f"{n.step_time_s:.3f}", f"{n.delta_s:+.3f}",
                      f"{-n.over_gib:.1f}", verdict(n, plan) + mark))  # fmt: skip
    tables = []
    for whole in (True, False):
        table = light_table(heading, collapse_padding=True)
        # fold, not cut: a long option (overlap-moe-expert-parallel-comm) stays whole
        table.add_column("change", no_wrap=whole, min_width=None if whole else 20,
                         overflow="fold")
        for name in ("step s", "vs plan", "free GiB"):
            table.add_column(name, justify="right", no_wrap=True)
        table.add_column("verdict", no_wrap=whole, overflow="fold")
        for row in cells:
            table.add_row(*row)
        tables.append(keep_whole(table))
    return [FirstThatFits(*tables), *(Prose(f"[{i}] {text}", style="dim")
                                      for i, text in enumerate(notes, 1))]  # fmt: skip


def _significance(n: Neighbour, plan: Plan) -> str:
    """`` (inside the plan's band, +/- 24 %)`` where a change's step lies within the plan's
    error band, so that the order of the two is not one the cost model can vouch for (as
    ``compare`` says of its rows: :func:`planner.report.bands.not_significant`)."""
    band = plan.predicted.error_band
    if n.step_time_s is None or band is None or not inside(
            n.step_time_s, plan.predicted.step_time_s, band):
        return ""
    return f" (inside the plan's band, {band.text})"


def why_not_lines(e: Explanation, plan: Plan) -> list[str]:
    """The user's configuration against the plan: slower or faster by how much and where, and
    whether it fits."""
    n = e.why_not
    if n is None or n.step_time_s is None or n.delta_s is None or n.over_gib is None:
        return []
    filled = "the rest from the plan" if plan.configuration else "the rest estimate's defaults"
    head = f"why not {n.change} ({filled}): {n.step_time_s:.3f} s"
    time, memory = differences(n, plan)
    if n.delta_s > 0:
        head += (f", {n.delta_s:.3f} s ({100 * n.delta_s / e.step_time_s:.1f} %) slower"
                 f"{_significance(n, plan)}")  # fmt: skip
    elif n.delta_s < 0:
        head += (f", {-n.delta_s:.3f} s ({-100 * n.delta_s / e.step_time_s:.1f} %) faster"
                 f"{_significance(n, plan)}: {_ruled_out(n, plan)}")  # fmt: skip
    else:
        head += ", the plan's step"
    lines = [head]
    if time:
        lines.append("  where: " + ", ".join(f"{name} {value:+.3f} s" for name, value in
                                             _largest(time, 4, at_least=5e-4)))
    if n.over_gib > 0:
        lines.append(f"  does not fit: {n.peak_memory_gib:.1f} GiB peak, {n.over_gib:.1f} GiB "
                     "over; against the plan: " + ", ".join(
                         f"{name} {value:+.1f}" for name, value in
                         _largest(memory, 3, at_least=0.05)) + " GiB")  # fmt: skip
    else:
        lines.append(f"  fits: {n.peak_memory_gib:.1f} GiB peak, {-n.over_gib:.1f} GiB free")
    if n.framework_refusals:
        lines.append(f"  {_who(plan)} refuses it: " + "; ".join(n.framework_refusals))
    return lines


def _largest(parts: Sequence[Part], count: int, *, at_least: float) -> list[tuple[str, float]]:
    """The ``count`` largest parts (``parts`` come largest first) of at least ``at_least``,
    and the rest summed, so that what is listed adds up to the whole (a why-not's ``where:``
    left out a pipeline's +0.180 s, its memory the reserve's +4.8 GiB)."""
    shown = [p for p in parts[:count] if abs(p.value) >= at_least]
    rest = sum(p.value for p in parts) - sum(p.value for p in shown)
    return [(_label(p.name), p.value) for p in shown] + (
        [("the rest", rest)] if abs(rest) >= at_least else [])


def explain_tables(e: Explanation, plan: Plan) -> list[RenderableType]:
    """The explanation as text: the plan, why it, what binds, the knobs, the hardware and the
    user's configuration."""
    devices = plan.cluster.num_nodes * plan.cluster.devices_per_node
    head = Group(
        plan_summary(plan, style="bold"),
        Prose(f"{plan.model.name} on {devices} x {plan.cluster.device} for {_who(plan)}: "
              f"step {with_band(e.step_time_s, plan.predicted.error_band)}, "
              f"peak {plan.predicted.peak_memory_gib:.1f} GiB"),
    )  # fmt: skip
    out: list[RenderableType] = [head, *map(_prose, why_this_plan(e, plan))]
    out += [Prose(line) for line in binding_lines(e)]
    band = plan.predicted.error_band
    if band is not None:  # what it rests on; what it extrapolates, part by part, follows
        out.append(Prose(band_line(band.model_copy(update={"extrapolated": ()}))))
    out += [Prose(line) for line in extrapolation_lines(e)]
    out += [Prose(line) for line in routing_lines(e)]
    if plan.predicted.profiled:  # what of the price a layer profile measured
        out.append(Prose(f"profile: {'; '.join(plan.predicted.profiled)}"))
    if e.sensitivities:
        out += _neighbour_table("one notch each way (free: GiB beside the margin; < 0: over)",
                                [(n.change, n) for n in e.sensitivities], plan)
        if any(n.framework_refusals for n in e.sensitivities):
            # estimate --framework of the same knobs prices another configuration: the
            # overlaps it is not given stay off there
            out.append(Prose("note: a refused change is priced with the plan's other settings, "
                             "its overlap flags included; `estimate --framework` turns off the "
                             "overlaps it is not given", style="dim"))
    if e.hardware:
        rows = []
        for w in e.hardware:
            rows.append((w.change, w.priced))
            if w.best is not None:
                rows.append((f"  then {w.best.change}", w.best))
        out += _neighbour_table("the same plan on other hardware",
                                rows, plan)
    out += map(_prose, why_not_lines(e, plan))
    out += [Prose(f"note: {text}", style="dim") for text in e.limits if e.sensitivities]
    return out


def _prose(line: str) -> Prose:
    """A line of the explanation: one that starts indented (a change) keeps its indent on
    every line it wraps to."""
    indent = "  " if line.startswith("  ") else ""
    return Prose(line.removeprefix(indent), indent=indent)


def extrapolation_lines(e: Explanation) -> list[str]:
    """What the step's price rests on beyond the validated runs, each with the parts of the
    step it prices: ``extrapolated: no validated run with ZeRO-3 on ... (data parallel comm
    exposed 1.20 s, 8 % of the step)``."""
    lines = []
    for gap in e.extrapolated:
        parts = ", ".join(f"{_label(p.name)} {p.value:.2f} s, {100 * p.share:.0f} %"
                          for p in gap.parts)  # fmt: skip
        # No part left: what it prices is hidden behind compute, and that overlap is the
        # unvalidated assumption.
        lines.append(f"extrapolated: {gap.text}" + (f" (prices {parts} of the step)" if parts
                                                    else " (priced as hidden behind compute)"))
    return lines


def routing_lines(e: Explanation) -> list[str]:
    """A dropless mixture of experts' plan at the other spreads of its experts' loads:
    ``routing: priced balanced (moe.expert_load_cv 0); at 0.045 (Mixtral 8x22B), ...``."""
    r = e.routing
    if r is None:
        return []
    ranks = f"the busiest of {r.expert_parallel} expert-parallel ranks routes"
    if r.spread == 0:
        at = "; ".join(f"at {o.spread:g} ({o.runs}) {o.busiest_load:.2f}x its share, "
                       f"{o.step_time_s:.3f} s ({o.delta_s:+.3f} s)" for o in r.others)
        return [f"routing: priced balanced (moe.expert_load_cv 0); at the spreads NVIDIA's "
                f"dropless runs showed, {ranks}: {at}"]
    balanced = r.others[0]
    return [f"routing: the experts' loads spread {r.spread:g} (moe.expert_load_cv): {ranks} "
            f"{r.busiest_load:.2f}x its share; balanced, the step would take "
            f"{balanced.step_time_s:.3f} s ({balanced.delta_s:+.3f} s)"]


def explain_json(e: Explanation) -> dict[str, Any]:
    """The ``planner explain --json`` object (JSON types only;
    ``Explanation.model_validate`` reads it back)."""
    return e.model_dump(mode="json")
