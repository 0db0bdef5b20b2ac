"""Which inputs a plan was made for: the hashes that name a model or cluster, the references a
plan keeps to them, and the check that refuses another model or cluster beside a plan.

Split from :mod:`planner.plan.schema`, whose :class:`~planner.plan.schema.InputRef` and
:class:`~planner.plan.schema.ClusterRef` these fill.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from planner.errors import InputError
from planner.plan.schema import ClusterRef, InputRef, Plan
from planner.spec import ClusterSpec, ModelSpec


def input_hash(spec: ModelSpec | ClusterSpec) -> str:
    """SHA-256 of an input's canonical JSON (so a plan names exactly what it was made for); a
    cluster's without what no price reads (:meth:`ClusterSpec.priced_dump`), so that keeping
    another validated run (``planner validate --write``) leaves its plans its own."""
    if isinstance(spec, ClusterSpec):
        # A layer profile set beside the cluster (--profile) is not the cluster file's: the
        # plan's predicted.profiled says what it measured.
        return _sha256(_without_profile(spec.priced_dump()))
    return _sha256(spec.model_dump(mode="json"))


def cluster_hashes(cluster: ClusterSpec) -> frozenset[str]:
    """The hashes a plan may name ``cluster`` by: :func:`input_hash`'s, the whole canonical
    JSON's that plans hashed before the error bands' runs were left out of it, and both
    without :data:`LATER_DEVICE_FIELDS`, whatever their values."""
    whole = _without_profile(cluster.model_dump(mode="json"))
    priced = _without_profile(cluster.priced_dump())
    older = [{**dump, "device": {k: v for k, v in dump["device"].items()
                                 if k not in LATER_DEVICE_FIELDS}}
             for dump in (priced, whole)]  # fmt: skip
    return frozenset({input_hash(cluster), _sha256(whole), *map(_sha256, older)})


LATER_DEVICE_FIELDS = frozenset({"compute_units"})
"""DeviceSpec fields added after plans were first written (issue 28, DeepEP's SMs): a plan made
before them names its cluster whatever their values, since no plan then priced DeepEP, the
only thing that reads them."""


def _without_profile(dumped: dict[str, Any]) -> dict[str, Any]:
    """A cluster's dump without the layer profile set beside it (``--profile``): not the
    cluster file's, and not there when older plans hashed their clusters."""
    dumped["device"]["efficiency"].pop("profile", None)
    return dumped


def _sha256(dumped: dict[str, object]) -> str:
    return hashlib.sha256(json.dumps(dumped, sort_keys=True).encode()).hexdigest()


UNPRICED_LATER_FIELDS = frozenset({"rotary_base", "rope_scaling", "norm_epsilon"})
"""ModelSpec fields added after plans of schema 5 were first written (issue 25) that change no
price: a plan made before them hashed the model without them, whatever their values."""
PRICED_LATER_FIELDS = frozenset({"sliding_window", "attn_logit_softcapping",
                                 "final_logit_softcapping", "post_norms", "scale_embeddings"})
"""ModelSpec fields added likewise that change the price: a plan made before them names the
model only while they are at their defaults (no model had them then)."""
LATER_MOE_FIELDS = frozenset({"router_score_function", "router_topk_normalized",
                              "router_topk_scaling_factor", "router_num_groups",
                              "router_group_topk", "router_aux_loss_coeff"})  # fmt: skip
"""MoESpec fields added likewise (the router's settings, unpriced)."""
MTP_FIELDS = frozenset({"mtp_layers"})
"""ModelSpec fields added after those (issue 28, multi-token prediction), priced: a plan made
before them names the model only while they are at their defaults."""
ROPE_SHARE_FIELDS = frozenset({"rotary_percent"})
"""ModelSpec fields added after those (the share of a head RoPE rotates) that change no price:
a plan made before them hashed the model without them, whatever their values."""


def model_hashes(model: ModelSpec) -> frozenset[str]:
    """The hashes a plan may name ``model`` by: its canonical JSON's, and, while the priced
    fields added since are at their defaults, the JSON older plans hashed: without
    :data:`MTP_FIELDS` (plans made since issue 25), and without those and the fields of
    :data:`UNPRICED_LATER_FIELDS`, :data:`PRICED_LATER_FIELDS` and :data:`LATER_MOE_FIELDS`
    (plans of schema 5 before it); all of them without :data:`ROPE_SHARE_FIELDS`, whatever
    their values (plans made before them)."""
    current = input_hash(model)
    fields = type(model).model_fields

    def at_defaults(names: frozenset[str]) -> bool:
        return all(getattr(model, name) == fields[name].default for name in names)

    def dumped(without: frozenset[str]) -> dict[str, Any]:
        return model.model_dump(mode="json", exclude=set(without | ROPE_SHARE_FIELDS))

    before_share = _sha256(dumped(frozenset()))
    if not at_defaults(MTP_FIELDS):
        return frozenset({current, before_share})
    since_issue_25 = _sha256(dumped(MTP_FIELDS))
    if not at_defaults(PRICED_LATER_FIELDS):
        return frozenset({current, before_share, since_issue_25})
    data = dumped(UNPRICED_LATER_FIELDS | PRICED_LATER_FIELDS | MTP_FIELDS)
    if data.get("moe") is not None:
        data["moe"] = {k: v for k, v in data["moe"].items() if k not in LATER_MOE_FIELDS}
    return frozenset({current, before_share, since_issue_25, _sha256(data)})


def check_inputs(
    plan: Plan, model: ModelSpec, cluster: ClusterSpec, *, model_label: str | None = None,
    cluster_label: str | None = None,
) -> None:  # fmt: skip
    """Refuse a model or cluster that is not the one ``plan`` was made for (the cluster at the
    plan's size), naming it by its label (a file, say) or else its name."""
    if plan.model.sha256 not in model_hashes(model):
        raise InputError(f"{model_label or 'the model ' + model.name} is not the model the plan "
                         f"was made for ({plan.model.name}, sha256 {plan.model.sha256[:12]})")
    resized = cluster.model_copy(update={"num_nodes": plan.cluster.num_nodes})
    if plan.cluster.sha256 not in cluster_hashes(resized):
        raise InputError(f"{cluster_label or 'the cluster ' + cluster.name} is not the cluster "
                         f"the plan was made for ({plan.cluster.name}, sha256 "
                         f"{plan.cluster.sha256[:12]})")  # fmt: skip


def at_plan_size(plan: Plan, cluster: ClusterSpec) -> ClusterSpec:
    """``cluster`` at the plan's number of nodes, as the commands read a plan's cluster file
    (:func:`check_inputs` compares the rest): a library caller's cluster of another size
    prices the plan on the devices it was made for, not a configuration that cannot divide."""
    nodes = plan.cluster.num_nodes
    return cluster if cluster.num_nodes == nodes else cluster.with_nodes(nodes)


def model_ref(model: ModelSpec) -> InputRef:
    """The reference a plan keeps to its model."""
    return InputRef(name=model.name, sha256=input_hash(model))


def cluster_ref(cluster: ClusterSpec) -> ClusterRef:
    """The reference a plan keeps to its cluster."""
    return ClusterRef(name=cluster.name, sha256=input_hash(cluster),
                      num_nodes=cluster.num_nodes, devices_per_node=cluster.devices_per_node,
                      device=cluster.device.name,
                      device_memory_gib=cluster.device.memory_gib,
                      scale_up_devices=(cluster.scale_up_devices
                                        if cluster.scale_up_devices > cluster.devices_per_node
                                        else None))  # fmt: skip
