"""What pricing an operator's sharding needs besides the op and the mesh: the cluster, the
precision and the stack's switches, one frozen record per layer query
(:func:`planner.sharding.strategies.price_strategy` reads it)."""

from __future__ import annotations

from dataclasses import dataclass

from planner import cost
from planner.spec import ClusterSpec
from planner.vocabulary import DEFAULT_RECOMPUTE_MODULES, Precision, Stack, StatesPrecision


@dataclass(frozen=True, slots=True, kw_only=True)
class StrategyContext:
    """What pricing a strategy needs besides the op and the mesh."""

    cluster: ClusterSpec
    """The device and network that price compute and collectives."""
    precision: Precision
    """Compute precision: the device's peak FLOP/s, and (unless ``states_precision`` says
    otherwise) the bytes of the weights' states and gradient sync."""
    states_precision: StatesPrecision | None = None
    """The precision of the weights' states when not the compute precision's
    (:func:`planner.cost.memory.states_precision`)."""
    flash_attention: bool = True
    """The attention core runs fused: causal FLOPs halved, backward 2.5 times the forward,
    no ``s x s`` tensors kept."""
    num_microbatches: int = 1
    """Microbatches per step: once-per-step gradient sync is shared among them."""
    replicas: int = 1
    """Data-parallel copies of the whole pipeline: every weight is replicated over them too."""
    tp_comm_overlap: bool = False
    """Tensor-parallel resharding next to a matmul hides behind it (Megatron-Core's
    ``--tp-comm-overlap``: Transformer Engine's userbuffers overlap the all-gather before a
    column-parallel GEMM and the reduce-scatter after a row-parallel one)."""
    grouped_experts: bool = False
    """A rank's routed experts run as one grouped GEMM, not one GEMM per expert in turn
    (:func:`planner.graph.stacks.grouped_experts`)."""
    recompute_modules: tuple[str, ...] = DEFAULT_RECOMPUTE_MODULES
    """What selective recomputation reruns (:data:`planner.vocabulary.RECOMPUTE_MODULES`)."""
    stack: Stack | None = None
    """The software that runs the layer: a layer profile's measurements of it, where the
    device has them (:mod:`planner.cost.profiled`), price its ops."""
    deepep: cost.Routing | None = None
    """The routing whose tokens DeepEP exchanges (:func:`planner.cost.deepep_time_s`); None:
    NCCL's all-to-all."""
    expert_load_cv: float = 0.0
    """Dropless routing's spread of tokens per expert (:attr:`planner.spec.MoESpec.
    expert_load_cv`): the routed experts and their exchange run at the busiest
    expert-parallel rank's load."""
    kv_allgather: bool = False
    """Context parallelism all-gathers K/V (PyTorch's, torchtitan's) instead of passing them
    around a ring (:func:`planner.cost.allgather_attention_exposed_s`)."""
