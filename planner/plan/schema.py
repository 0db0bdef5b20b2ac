"""The Plan: what to launch, and what the planner predicts for it.

Immutable, JSON round-trip with a ``schema_version``; report, export and the CLI consume a Plan
and nothing else. Layers are numbered as in :func:`planner.graph.lower`: 1..L are the decoder
layers; the first stage also holds the embedding and the last the final norm, LM head and loss.
The hashes that name a plan's inputs, and the check of an input against a plan, are
:mod:`planner.plan.inputs`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from planner.plan.bands import ErrorBand, MemoryBand
from planner.plan.config import ParallelConfig
from planner.vocabulary import (
    COMPILED_STACKS,
    FP8_STACKS,
    FUSED_LOSS_STACKS,
    GIB,
    MoeDispatcher,
    Objective,
    OptimizerMoments,
    Precision,
    Recompute,
    ScheduleName,
    Stack,
)

SCHEMA_VERSION = 6
READABLE_VERSIONS = (2, 3, 4, 5, 6)
"""Schema 2 plans predate framework targets: they read as plans for ``any``; schema 2-4 plans
predate error bands: their band is not recorded (:attr:`Predicted.error_band`); schema 2-5
plans stored the bubble over the critical stage's busy time: they read with its share of the
step (:attr:`Predicted.bubble_fraction`)."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class InputRef(_Frozen):
    """Which input a plan was made for: its name and a hash of its canonical JSON."""

    name: str
    sha256: str


class ClusterRef(InputRef):
    """The cluster, with its size."""

    num_nodes: int
    devices_per_node: int
    device: str
    device_memory_gib: float
    scale_up_devices: int | None = None
    """Devices of one domain of the innermost network level when it spans several nodes (a
    GB200 NVL72 rack); None when it is the node (and in plans written before it was kept)."""


class ScheduleSpec(_Frozen):
    """The pipeline schedule."""

    name: ScheduleName
    virtual_stages: int = Field(default=1, ge=1)


class RunFlags(_Frozen):
    """Switches the framework must be launched with for the prediction to hold."""

    flash_attention: bool = True
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False
    tp_comm_overlap: bool = False
    overlap_moe_expert_parallel_comm: bool = False
    moe_dispatcher: MoeDispatcher = Field(
        default="alltoall", description="How the experts' tokens are exchanged where the "
        "experts are spread over ranks: NCCL's all-to-all, or DeepEP's dispatch and combine.")
    optimizer_moments: OptimizerMoments = Field(
        default="fp32", description="Adam's moments as the optimizer keeps them (bf16: "
        "Megatron-LM's precision-aware optimizer).")


class StageParallel(_Frozen):
    """A stage's sharding summarised in the degrees a user sets (the ILP's choice, or the
    uniform configuration's)."""

    tp: int = Field(ge=1)
    dp: int = Field(ge=1, description="Data-parallel ways inside the stage's mesh.")
    cp: int = Field(default=1, ge=1)
    ep: int = Field(default=1, ge=1)
    etp: int | None = Field(default=None, ge=1, description="Expert tensor-parallel degree "
                            "where it is not tp: 1, the experts folded over the "
                            "tensor-parallel ranks.")  # fmt: skip
    sp: bool = False
    zero: int = Field(default=0, ge=0, le=3, description="ZeRO stage (0: none).")
    recompute: Recompute = "none"


class MemoryBreakdown(_Frozen):
    """Peak memory of one device, by what fills it."""

    weights_gib: float
    gradients_gib: float
    optimizer_gib: float
    """Optimizer states (fp32 master weights and Adam's moments, ZeRO-sharded)."""
    activations_gib: float
    """Activations kept for the backward of the microbatches in flight."""
    working_gib: float = 0.0
    """The transient of the layer running at the peak (a fully recomputed layer rebuilt, the
    K/V PyTorch's context parallelism all-gathers)."""
    loss_workspace_gib: float = 0.0
    """The loss's backward workspace, when it is the peak's transient."""
    gathered_parameters_gib: float = 0.0
    """ZeRO-3's gathered and prefetched parameters and a layer's unsharded gradients."""
    other_gib: float
    """The device's reserved memory (CUDA context, NCCL's buffers, the allocator's cache)."""

    @property
    def total_gib(self) -> float:
        """All parts."""
        return sum(getattr(self, name) for name in type(self).model_fields)

    @property
    def allocated_gib(self) -> float:
        """Every part but the reserve: the peak PyTorch's allocator hands to tensors
        (``torch.cuda.max_memory_allocated``)."""
        return self.total_gib - self.other_gib

    @classmethod
    def from_bytes(cls, parts: Sequence[float]) -> MemoryBreakdown:
        """From the parts in bytes, in field order (:class:`planner.cost.MemoryParts`)."""
        return cls(**{name: b / GIB for name, b in zip(cls.model_fields, parts, strict=True)})


class StageTime(_Frozen):
    """Seconds one microbatch spends in the stage (all its model chunks), by part, and by
    phase for the schedule simulator; the two views add up to the same total."""

    compute_s: float
    communication_s: float
    """Tensor, context and expert parallel collectives, and data-parallel traffic exposed
    every microbatch (ZeRO-2/3)."""
    pipeline_s: float
    """Point-to-point sends of activations forward and gradients back."""
    forward_s: float
    """Forward compute with its share of the communication."""
    backward_s: float
    """Backward compute with its share of the communication."""
    recompute_s: float = 0.0
    """Forward work rerun before the backward, with its share of the communication."""
    weight_s: float = 0.0
    """Of ``backward_s``, the weight gradients (a pass of their own under a zero-bubble
    schedule; 0 in plans written before the planner priced them apart)."""
    sync_tail_s: float = 0.0
    """Once per step, after the stage's last backward: the data-parallel gradient reduction
    and weight gathers the overlap flags leave exposed (and the tied embedding's
    all-reduce)."""
    tensor_parallel_comm_s: float = 0.0
    """Of ``communication_s``, the tensor-parallel collectives and resharding (0 in plans
    written before the planner recorded the parts: all of it unattributed)."""
    context_parallel_comm_s: float = 0.0
    """Of ``communication_s``, ring attention's exposed K/V exchange."""
    expert_parallel_comm_s: float = 0.0
    """Of ``communication_s``, the experts' all-to-all."""
    data_parallel_comm_s: float = 0.0
    """Of ``communication_s``, the data-parallel traffic of every microbatch (ZeRO-2/3
    reduce-scatters and gathers, and the once-per-step traffic's share) left exposed."""
    tensor_parallel_hidden_s: float = 0.0
    """Not in ``communication_s``: tensor-parallel resharding hidden behind matmuls
    (``tp_comm_overlap``)."""
    context_parallel_hidden_s: float = 0.0
    """Not in ``communication_s``: ring attention's K/V exchange hidden behind each ring
    step's attention compute."""
    expert_parallel_hidden_s: float = 0.0
    """Not in ``communication_s``: the experts' all-to-all hidden behind compute."""
    data_parallel_hidden_s: float = 0.0
    """Not in ``communication_s``: the per-microbatch data-parallel traffic the forward and
    backward hide (ZeRO-3's prefetched gathers, ZeRO-2/3's reduce-scatters)."""
    grad_reduce_hidden_s: float = 0.0
    """Not in ``sync_tail_s``: once per step, the gradient reduction the last backward hides
    (``overlap_grad_reduce``)."""
    param_gather_hidden_s: float = 0.0
    """Not in ``sync_tail_s``: once per step, the updated weights' gather the next step's
    first forward hides (``overlap_param_gather``)."""

    @model_validator(mode="after")
    def _check(self) -> StageTime:
        by_phase = self.forward_s + self.backward_s + self.recompute_s
        by_part = self.compute_s + self.communication_s
        if abs(by_phase - by_part) > 1e-9 * max(1.0, by_phase):
            raise ValueError(f"forward + backward + recompute ({by_phase}) != compute + "
                             f"communication ({by_part})")  # fmt: skip
        parts = self.attributed_comm_s
        if parts > self.communication_s * (1 + 1e-9) + 1e-15:
            raise ValueError(f"tensor + context + expert + data parallel communication "
                             f"({parts}) > communication ({self.communication_s})")  # fmt: skip
        return self

    @property
    def attributed_comm_s(self) -> float:
        """The parts of ``communication_s`` recorded by kind (all of it in plans of this
        version; none in older ones)."""
        return (self.tensor_parallel_comm_s + self.context_parallel_comm_s
                + self.expert_parallel_comm_s + self.data_parallel_comm_s)  # fmt: skip

    @property
    def total_s(self) -> float:
        """All parts."""
        return self.compute_s + self.communication_s + self.pipeline_s


class PlanStage(_Frozen):
    """One pipeline stage."""

    index: int = Field(ge=0)
    layers: tuple[int, int] = Field(description="First and last decoder layer, inclusive.")
    num_devices: int = Field(ge=1)
    mesh: tuple[int, int]
    ranks: tuple[tuple[int, ...], ...] = Field(
        description="The stage's ranks in each data-parallel replica of the pipeline."
    )
    parallel: StageParallel
    op_shardings: dict[str, str] = Field(
        default_factory=dict, description="Operator (kind.op) -> split per mesh axis."
    )
    memory: MemoryBreakdown
    time: StageTime

    @model_validator(mode="after")
    def _check(self) -> PlanStage:
        first, last = self.layers
        if first < 1 or last < first:
            raise ValueError(f"stage {self.index}: layers {self.layers} is not a range")
        if self.mesh[0] * self.mesh[1] != self.num_devices:
            raise ValueError(f"stage {self.index}: mesh {self.mesh} != {self.num_devices} "
                             "devices")  # fmt: skip
        return self

    @property
    def num_layers(self) -> int:
        """Decoder layers in the stage."""
        return self.layers[1] - self.layers[0] + 1


class StepTime(_Frozen):
    """Where a step's seconds go on the critical stage; the parts add up to the step."""

    compute_s: float
    tensor_parallel_comm_s: float
    context_parallel_comm_s: float
    expert_parallel_comm_s: float
    pipeline_comm_s: float
    pipeline_bubble_s: float
    data_parallel_comm_exposed_s: float
    optimizer_s: float


class Predicted(_Frozen):
    """What the cost model predicts for one step."""

    step_time_s: float
    """Seconds per optimizer step."""
    time: StepTime
    """The step's seconds by part."""
    tokens_per_s: float
    """Tokens trained per second, over the whole cluster."""
    model_tflops_per_gpu: float
    """Model FLOPs (three times the forward's, no recomputation) per second and device, in
    TFLOP/s."""
    hardware_tflops_per_gpu: float
    """The FLOPs the devices execute (recomputation included) per second and device, in
    TFLOP/s."""
    mfu: float
    """Model FLOPs utilisation, a fraction between 0 and 1: model FLOP/s over the device's
    peak at the run's precision."""
    peak_memory_gib: float
    """The most loaded device's peak, in GiB, the reserve for what the allocator and the
    runtime hold included."""
    bubble_fraction: float
    """The pipeline bubble's share of the step, ``time.pipeline_bubble_s / step_time_s``
    (:func:`planner.cost.bubble_share`), between 0 and 1."""
    error_band: ErrorBand | None = None
    """The step time's error band. None only in a plan read from a file written before bands
    (schema 2-4): unknown, which is not the same as uncalibrated (the device may have runs),
    and printed as not recorded."""
    memory_band: MemoryBand | None = None
    """The peak memory's band; None in a plan written before memory bands."""
    profiled: tuple[str, ...] = ()
    """What a layer profile (``--profile``) measured of the price: a line per layer kind,
    measured at which shard or priced by the model and why; empty without a profile."""


class SolverSummary(_Frozen):
    """How the plan was found."""

    time_s: float
    status: str
    """``optimal`` (the search's space exhausted, every layer ILP proved), ``feasible`` (a
    layer ILP stopped at its limit, or the heuristic's rule), ``time_limit`` (the search
    stopped at its limit; ``gap`` says how much a plan not searched could still save),
    ``priced`` (a configuration given)."""
    objective: float | None = None
    """The step time the plan was ranked by (seconds): the prediction, or its band's slow end
    at :attr:`ranked_by`."""
    ranked_by: Objective = "expected"
    """What plans were ranked by (:mod:`planner.cost.risk`)."""
    gap: float | None = None
    ilp_count: int = 0
    cache_hits: int = 0
    configurations: int = 0
    """Configurations priced (the baselines) or candidates searched (the ILP search)."""


class Plan(_Frozen):
    """A complete parallel training plan.

    >>> import planner
    >>> from planner.plan.files import plan_from_json
    >>> model = planner.load_model("instances/models/gpt-1.7b.json")
    >>> cluster = planner.load_cluster("instances/clusters/dgx-a100-80gb.json", nodes=1)
    >>> plan = planner.solve(model, cluster, planner.SolveOptions(pins=planner.Pins(tp=2)))
    >>> plan.framework, plan.configuration.tp, plan.configuration.dp, len(plan.stages)
    ('megatron', 2, 4, 1)
    >>> plan.global_batch_size, plan.micro_batch_size, plan.num_microbatches  # 512 = 4 x 8 x 16
    (512, 8, 16)
    >>> plan_from_json(plan.to_json()) == plan  # the JSON ``planner solve --out`` writes
    True
    """

    schema_version: Literal[6] = SCHEMA_VERSION
    method: str
    framework: str = Field(
        default="any", description="What the plan was made for: a framework that launches it "
        "(megatron, mindspeed, deepspeed, colossalai, torchtitan) or any (per-operator).",
    )  # fmt: skip
    configuration: ParallelConfig | None = Field(
        default=None, description="The uniform configuration the plan is, every default "
        "filled in (None: a per-operator plan, which no framework launches).",
    )  # fmt: skip
    memory_margin_gib: float = Field(
        default=0.0, ge=0, description="Device memory the plan keeps free beside its peak "
        "(allocator fragmentation, communication buffers).",
    )  # fmt: skip
    model: InputRef
    cluster: ClusterRef
    precision: Precision
    stack: Stack = Field(default="megatron-te", description="The software that runs each layer "
                         "(planner.vocabulary.Stack): megatron-te-fp8 for Transformer Engine's "
                         "FP8 linears.")  # fmt: skip
    global_batch_size: int = Field(ge=1)
    seq_length: int = Field(ge=1)
    micro_batch_size: int = Field(ge=1)
    num_microbatches: int = Field(ge=1)
    schedule: ScheduleSpec
    data_parallel_replicas: int = Field(ge=1)
    flags: RunFlags = RunFlags()
    stages: tuple[PlanStage, ...] = Field(min_length=1)
    predicted: Predicted
    solver: SolverSummary

    @property
    def num_layers(self) -> int:
        """Decoder layers over all stages."""
        return sum(s.num_layers for s in self.stages)

    @property
    def uniform(self) -> StageParallel | None:
        """The stages' common sharding, when every stage has the same one."""
        first = self.stages[0].parallel
        return first if all(s.parallel == first for s in self.stages) else None

    def summary(self) -> str:
        """The plan in one line, as a user would say it; a degree that differs between stages
        is listed as its values (``TP1/4``), a switch on only some stages says so."""
        stages = [s.parallel for s in self.stages]

        def values(name: str) -> str:
            return "/".join(sorted({str(getattr(p, name)) for p in stages}, key=int))

        def some(flag: list[bool], text: str) -> list[str]:
            if all(flag):
                return [text]
            return [f"{text} on {sum(flag)} of {len(flag)} stages"] if any(flag) else []

        p = stages[0]
        dp = self.data_parallel_replicas * p.dp
        parts = [f"TP{values('tp')}", f"PP{len(self.stages)}", f"DP{dp}"]
        algo = self.configuration.cp_algo if self.configuration is not None else "ring"
        how = {"ring": "", "ulysses": " (Ulysses)", "allgather": " (K/V all-gathered)"}[algo]
        parts += [f"CP{values('cp')}{how}"] * any(q.cp > 1 for q in stages)
        folded = any(q.etp == 1 for q in stages)
        deepep = self.flags.moe_dispatcher == "deepep"
        parts += [f"EP{values('ep')}" + " (ETP1)" * folded + " (DeepEP)" * deepep] * any(
            q.ep > 1 for q in stages)
        text = " x ".join(parts) + f", mbs {self.micro_batch_size}"
        schedule = {"1f1b": "1F1B", "gpipe": "GPipe", "interleaved": "interleaved 1F1B",
                    "zb-h1": "ZB-H1", "zb-v": "ZB-V"}  # fmt: skip
        text += f", {schedule[self.schedule.name]}"
        if self.schedule.virtual_stages > 1 and self.schedule.name == "interleaved":
            text += f" (v={self.schedule.virtual_stages})"
        extras = some([q.sp for q in stages], "sequence parallel")
        some_layers = self.configuration is not None and self.configuration.recompute_layers
        modules = self.configuration is not None and self.configuration.recompute_modules
        for mode in ("selective", "full"):
            label = f"{mode} recompute"
            if mode == "selective" and modules:
                label += f" ({modules.replace(',', ', ')})"
            if mode == "full" and some_layers:
                # Megatron's --recompute-num-layers counts per model chunk (per stage when
                # the stages are not interleaved; of all of them without a pipeline).
                unit = "chunk" if self.schedule.virtual_stages > 1 else "stage"
                label += (f" of {some_layers} of {self.num_layers} layers"
                          if len(self.stages) == 1 else
                          f" of {some_layers} layer{'s' * (some_layers > 1)} per {unit}")
            extras += some([q.recompute == mode for q in stages], label)
        # ZeRO-1 is Megatron's distributed optimizer; DeepSpeed and Colossal-AI name the stage.
        sharded = "ZeRO-1" if self.framework in ("deepspeed", "colossalai") else \
            "distributed optimizer"
        for stage, name in ((1, sharded), (2, "ZeRO-2"), (3, "ZeRO-3")):
            extras += some([q.zero == stage for q in stages], name)
        if self.flags.optimizer_moments == "bf16":
            extras.append("Adam moments in bf16")
        if self.flags.tp_comm_overlap and any(q.tp > 1 for q in stages):
            extras.append("TP communication overlapped")
        if self.flags.overlap_moe_expert_parallel_comm:
            extras.append("experts' all-to-alls overlapped")
        if self.configuration is not None and self.configuration.offload != "none":
            how = " (ZeRO-Offload)" if self.configuration.offload == "zero-offload" else ""
            extras.append(f"optimizer offloaded to the host{how}")
        if self.stack in FP8_STACKS:
            extras.append("FP8 linears")
        if self.stack in FUSED_LOSS_STACKS:
            extras.append("fused loss")
        if self.stack in COMPILED_STACKS:
            extras.append("torch.compile")
        return ", ".join([text, *extras])

    def to_json(self) -> str:
        """Canonical JSON: sorted keys, two-space indent, floats as Python prints them."""
        return json.dumps(self.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"

