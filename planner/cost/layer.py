"""A layer's priced parts (what an assignment of strategies costs one device for one
microbatch) and the per-microbatch costs the step composer adds up."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from planner.cost.elementwise import Real, maximum, minimum
from planner.vocabulary import RECOMPUTE_MODES


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerParts:
    """One microbatch through one layer on one device, by part (seconds, bytes, FLOPs)."""

    forward_s: float
    """Forward compute of the layer's ops (communication apart)."""
    backward_s: float
    """Backward compute of the layer's ops (communication apart)."""
    tp_comm_s: float
    """Resharding between ops (forward and backward) and the ops' own collectives other than
    the two below (the vocab-parallel loss)."""
    cp_comm_s: float
    """Ring attention's exposed K/V exchange."""
    ep_comm_s: float
    """The experts' all-to-all."""
    rerun_s: tuple[float, float, float]
    """Compute rerun per recomputation mode (none, selective, full): the attention core, or
    the whole forward."""
    rerun_comm_s: tuple[float, float, float]
    """Collectives rerun under full recomputation (tensor, context, expert parallel, as the
    three fields above): the forward's own collectives and resharding."""
    kept_bytes: tuple[float, float, float]
    """Activations kept per in-flight microbatch, per mode."""
    working_bytes: tuple[float, float, float]
    """The transient peak on top, per mode (one microbatch's activations, rebuilt)."""
    rerun_flops: tuple[float, float, float]
    """FLOPs recomputed per mode (the whole microbatch, not one device's share)."""
    weights: tuple[tuple[float, tuple[int, ...]], ...]
    """Local parameters and the mesh axes holding copies of them."""
    loss_bytes: float = 0.0
    """The loss's backward workspace on top of what the layer keeps (the head only)."""
    weight_s: float = 0.0
    """Of ``backward_s``, the weight gradients (a pass of their own under a zero-bubble
    schedule)."""
    hidden_comm_s: tuple[float, float, float] = (0.0, 0.0, 0.0)
    """Collectives hidden behind compute, forward and backward (tensor, context, expert
    parallel, as ``tp_comm_s``, ``cp_comm_s``, ``ep_comm_s``): not on the critical path."""
    rerun_hidden_comm_s: tuple[float, float, float] = (0.0, 0.0, 0.0)
    """The forward's part of ``hidden_comm_s``: hidden again in a fully recomputed forward."""
    selective_rerun_comm_s: tuple[float, float, float] = (0.0, 0.0, 0.0)
    """Collectives rerun under selective recomputation (tensor, context, expert parallel): the
    forward's own collectives and resharding of the checkpointed modules (Megatron-Core's
    ``mlp``, ``moe``, ``shared_experts``)."""

    def rerun_comm(self, recompute: str) -> tuple[float, float, float]:
        """The collectives ``recompute`` runs again, exposed (tensor, context, expert)."""
        if recompute == "full":
            return self.rerun_comm_s
        return self.selective_rerun_comm_s if recompute == "selective" else (0.0, 0.0, 0.0)

    @property
    def time_s(self) -> float:
        """Compute and exposed communication of one microbatch's forward and backward, before
        any rerun or gradient sync (what the layer ILP's objective adds those to)."""
        return self.forward_s + self.backward_s + self.tp_comm_s + self.cp_comm_s + self.ep_comm_s

    def rerun_total_s(self, recompute: str) -> float:
        """Everything ``recompute`` runs again: compute, and the collectives it reruns."""
        return self.rerun_s[self.mode(recompute)] + sum(self.rerun_comm(recompute))

    def mode(self, recompute: str) -> int:
        """Index of a recomputation mode in the per-mode tuples."""
        return RECOMPUTE_MODES.index(recompute)

    def weight_groups(self) -> tuple[tuple[tuple[int, ...], float], ...]:
        """Parameters summed by the mesh axes holding their copies (one gradient bucket per
        group, as frameworks bucket them)."""
        totals: dict[tuple[int, ...], float] = {}
        for params, axes in self.weights:
            totals[axes] = totals.get(axes, 0.0) + params
        return tuple(sorted(totals.items()))


_TRANSIENT = ("working_bytes", "loss_bytes", "layer_params")
""":class:`LayerCost`'s transient peaks (and the largest layer): the larger of two, never their
sum."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerCost:
    """One device's seconds and bytes for one microbatch through some layers."""

    forward_s: float = 0.0
    """Forward compute."""
    backward_s: float = 0.0
    """Backward compute."""
    recompute_s: float = 0.0
    """Forward recomputed in backward, with its collectives."""
    weight_s: float = 0.0
    """Of ``backward_s``, the weight gradients."""
    tp_comm_s: float = 0.0
    """Resharding between ops and the ops' own collectives other than ring attention's and the
    experts' (the vocab-parallel loss), forward and backward, with their rerun under full
    recomputation."""
    cp_comm_s: float = 0.0
    """Ring attention's exposed K/V exchange (and its rerun under full recomputation)."""
    ep_comm_s: float = 0.0
    """The experts' all-to-all (and its rerun under full recomputation)."""
    pipeline_comm_s: float = 0.0
    """Pipeline sends: the activation forward and its gradient back, per microbatch (added per stage
    by ``with_pipeline_comm``)."""
    tp_hidden_s: float = 0.0
    """Tensor-parallel resharding hidden behind matmuls (``tp_comm_overlap``), not in
    ``tp_comm_s``; with its rerun under full recomputation."""
    cp_hidden_s: float = 0.0
    """Ring attention's K/V exchange hidden behind each ring step's compute, not in
    ``cp_comm_s``; with its rerun under full recomputation."""
    ep_hidden_s: float = 0.0
    """The experts' all-to-all hidden behind another microbatch's compute
    (:meth:`with_moe_overlap`), not in ``ep_comm_s``."""
    activation_bytes: float = 0.0
    """Kept per in-flight microbatch."""
    working_bytes: float = 0.0
    """Transient peak on top (a fully recomputed layer's activations)."""
    loss_bytes: float = 0.0
    """The loss's transient peak on top: the gradients over the vocabulary its backward holds
    (:data:`planner.graph.stacks.LOSS_WORKING`), on the stage that holds the head."""
    recompute_flops: float = 0.0
    """Extra forward FLOPs of recomputation (whole model replica, not per device)."""
    layer_params: float = 0.0
    """The largest layer's local parameters (after tensor and expert parallelism, before
    ZeRO): what ZeRO-3 gathers at a time."""

    @classmethod
    def zero(cls) -> LayerCost:
        """Nothing."""
        return cls()

    @property
    def compute_s(self) -> float:
        """Forward, backward and recomputation."""
        return self.forward_s + self.backward_s + self.recompute_s

    @property
    def time_s(self) -> float:
        """Everything on the critical path of one microbatch."""
        comm = self.tp_comm_s + self.cp_comm_s + self.ep_comm_s + self.pipeline_comm_s
        return self.compute_s + comm

    def scaled(self, count: int) -> LayerCost:
        """``count`` identical copies (the transient peaks do not add up)."""
        values = {f.name: getattr(self, f.name) * count for f in fields(self)
                  if f.name not in _TRANSIENT}  # fmt: skip
        return replace(self, **values)

    def __add__(self, other: LayerCost) -> LayerCost:
        # Transients are one at a time: the larger of two, on top of everything kept (exact
        # when the larger runs last, as the loss does; an upper bound otherwise).
        values = {f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)
                  if f.name not in _TRANSIENT}  # fmt: skip
        transient = {name: maximum(getattr(self, name), getattr(other, name))
                     for name in _TRANSIENT}  # fmt: skip
        return LayerCost(**values, **transient)

    def with_weight_work(self, seconds: Real) -> LayerCost:
        """The same with ``seconds`` more of weight-gradient work in the backward (an
        optimizer's gradient accumulation after it)."""
        return replace(self, backward_s=self.backward_s + seconds,
                       weight_s=self.weight_s + seconds)  # fmt: skip

    def with_pipeline_comm(self, seconds: float) -> LayerCost:
        """The same with ``seconds`` of pipeline sends added."""
        return replace(self, pipeline_comm_s=self.pipeline_comm_s + seconds)

    def with_moe_overlap(self, paired: Real, contention: Real = 0.0) -> LayerCost:
        """The experts' all-to-alls as Megatron-Core's combined 1F1B runs them
        (``--overlap-moe-expert-parallel-comm``: ``megatron/core/pipeline_parallel/
        combined_1f1b.py``): one microbatch's forward beside another's backward, layer by
        layer, the forward's dispatch and combine hidden by the backward's compute and the
        backward's by the forward's. Half the all-to-all time is each direction's. Of the
        microbatches, ``paired`` (a fraction; 0: no overlap) run so
        (:func:`~planner.cost.pipeline.paired_fraction`); the rest stay exposed. What hides
        still slows the compute beside it by ``contention`` of its time.

        >>> t = LayerCost(forward_s=1.0, backward_s=2.0, ep_comm_s=3.0)
        >>> overlapped = t.with_moe_overlap(0.75)
        >>> overlapped.ep_comm_s, overlapped.ep_hidden_s  # 1.5 + 1.0 hidden of each pair
        (1.125, 1.875)
        """
        half = self.ep_comm_s / 2
        hidden = paired * (minimum(half, self.backward_s + self.recompute_s)
                           + minimum(half, self.forward_s))  # fmt: skip
        return replace(self, ep_comm_s=self.ep_comm_s - hidden * (1 - contention),
                       ep_hidden_s=self.ep_hidden_s + hidden)  # fmt: skip


def layer_cost(parts: LayerParts, recompute: str, *, count: int = 1) -> LayerCost:
    """``count`` layers of one priced sharding (:class:`~planner.sharding.assignment.LayerParts`)
    under ``recompute``, as the step composer sees them."""
    k = parts.mode(recompute)
    rerun = parts.rerun_comm(recompute)
    hidden = parts.hidden_comm_s
    hidden_rerun = parts.rerun_hidden_comm_s if recompute == "full" else (0.0, 0.0, 0.0)
    one = LayerCost(
        forward_s=parts.forward_s, backward_s=parts.backward_s, recompute_s=parts.rerun_s[k],
        weight_s=parts.weight_s,
        tp_comm_s=parts.tp_comm_s + rerun[0], cp_comm_s=parts.cp_comm_s + rerun[1],
        ep_comm_s=parts.ep_comm_s + rerun[2],
        tp_hidden_s=hidden[0] + hidden_rerun[0], cp_hidden_s=hidden[1] + hidden_rerun[1],
        ep_hidden_s=hidden[2] + hidden_rerun[2],
        activation_bytes=parts.kept_bytes[k], working_bytes=parts.working_bytes[k],
        loss_bytes=parts.loss_bytes, recompute_flops=parts.rerun_flops[k],
        layer_params=sum(n for n, _ in parts.weights),
    )  # fmt: skip
    return one.scaled(count)


def partly_recomputed(
    every: LayerCost, kept: LayerCost, *, layers: int, recomputed: int
) -> LayerCost:
    """One model chunk's ``layers`` layers of one kind of which the first ``recomputed`` are
    fully recomputed (``every``: one layer under full recomputation) and the rest keep their
    activations (``kept``: one layer under none), as Megatron's ``--recompute-method block``
    runs a chunk (``NVIDIA/Megatron-LM@d98e8a6 megatron/core/recompute.py:167-178``).

    The backward reaches the recomputed layers last: by then the chunk's other layers have
    freed their activations, so rebuilding one layer's adds only what it exceeds them by.

    >>> every = LayerCost(recompute_s=1.0, activation_bytes=2.0, working_bytes=10.0)
    >>> kept = LayerCost(activation_bytes=10.0)
    >>> one = partly_recomputed(every, kept, layers=4, recomputed=1)
    >>> one.recompute_s, one.activation_bytes, one.working_bytes
    (1.0, 32.0, 0.0)
    >>> partly_recomputed(every, kept, layers=4, recomputed=9).working_bytes
    10.0
    """
    if recomputed >= layers:
        return every.scaled(layers)
    if recomputed <= 0:
        return kept.scaled(layers)
    rest = layers - recomputed
    mixed = every.scaled(recomputed) + kept.scaled(rest)
    freed = kept.activation_bytes * rest
    return replace(mixed, working_bytes=maximum(every.working_bytes - freed, 0.0))
