"""``planner explain``: why a plan is what it is."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from planner.cli.app import JsonOpt, ProfileOpt, app, load_inputs, note, print_json, render
from planner.diagnose.explain import explain
from planner.diagnose.why_not import parse_changes
from planner.errors import InputError
from planner.plan.files import plan_from_json
from planner.plan.inputs import check_inputs
from planner.report.explain import explain_json, explain_tables
from planner.spec.reading import read_text


@app.command("explain", short_help="Why this plan: what binds, each knob a notch either way.")
def explain_cmd(
    plan_file: Annotated[Path, typer.Argument(help="plan.json")],
    model: Annotated[Path | None, typer.Option(help="The plan's model (to price changes).")] = None,
    cluster: Annotated[Path | None, typer.Option(help="The plan's cluster.")] = None,
    why_not: Annotated[
        str | None,
        typer.Option("--why-not", help="Your own configuration, e.g. tp=8,pp=16,mbs=2 (the "
                     "rest from the plan), priced beside the plan."),
    ] = None,
    layer_profile: ProfileOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Why this plan: what binds, each knob one notch either way, the plan on other hardware,
    and your own configuration beside it."""
    changes = None if why_not is None else parse_changes(why_not)
    if (model is None) != (cluster is None):
        raise InputError("give both --model and --cluster (the plan's), or neither")
    if layer_profile is not None and model is None:
        raise InputError("--profile prices changes to the plan: give --model and --cluster too")
    plan = plan_from_json(read_text(plan_file), source=str(plan_file))
    specs = (None, None)
    if model is not None and cluster is not None:
        specs = load_inputs(model, cluster, nodes=plan.cluster.num_nodes,
                            names=("--model", "--cluster"), profile=layer_profile)  # fmt: skip
        check_inputs(plan, *specs, model_label=str(model), cluster_label=str(cluster))
    if plan.predicted.profiled and model is not None and layer_profile is None:
        note("the plan was priced with a layer profile: give explain its --profile to price "
             "the changes the same way")
    result = explain(plan, *specs, why_not=changes)
    if as_json:
        print_json(explain_json(result))
    else:
        render(explain_tables(result, plan))
