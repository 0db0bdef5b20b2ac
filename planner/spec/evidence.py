"""What a device's error bands rest on: each validated run, the regime it ran in and how far the
cost model missed it (:class:`ValidatedRun`), kept in the cluster file's
``device.efficiency.evidence`` by ``planner validate --write`` and ``planner calibrate
--write``. A prediction's band is built from the runs nearest to it
(:func:`planner.cost.uncertainty.error_band`)."""

from __future__ import annotations

from pydantic import Field

from planner.spec.fields import Float, Int, Name
from planner.spec.fields import Frozen as _Frozen
from planner.vocabulary import Mechanism, Precision, Stack


class Regime(_Frozen):
    """Where a prediction or a run sits in the features that drive the cost model's error: the
    software stack, the mechanisms it splits the run with, the sequence length, the devices,
    the network they span, the model's size and whether it routes experts, the compute
    precision."""

    stack: Stack
    """The software that runs each layer (:data:`~planner.vocabulary.Stack`)."""
    mechanisms: tuple[Mechanism, ...] = ()
    """The mechanisms used, in :data:`~planner.vocabulary.MECHANISMS` order."""
    seq_length: Int = Field(gt=0)
    """Tokens per sequence."""
    num_devices: Int = Field(gt=0)
    """Devices of the run."""
    network_gb_s: Float = Field(gt=0)
    """The achieved bandwidth per device of the outermost network level its devices span
    (GB/s): the slowest link its traffic crosses."""
    gflop_per_token: Float = Field(gt=0)
    """Model GFLOPs of one token's forward (twice the active parameters, attention's scores
    added): the model's size as the compute sees it."""
    moe: bool = False
    """Whether the model routes tokens to experts."""
    precision: Precision = "bf16"
    """The compute precision."""


class ValidatedRun(Regime):
    """One run measured and priced: its regime, its error, and what it reached."""

    id: Name
    """The record's id."""
    family: Name
    """The framework family that ran it (``megatron``, ``fsdp``, ``deepspeed``, ``pytorch``)."""
    error: Float = Field(ge=-1)
    """``predicted / measured - 1`` of its step time."""
    memory_error: Float | None = Field(default=None, ge=-1)
    """``predicted / measured - 1`` of its peak memory where it was measured: the allocated
    peak, or else the whole peak against nvidia-smi's memory in use."""
    mfu: Float = Field(ge=0)
    """Its measured model FLOPs utilisation."""
    hfu: Float | None = Field(default=None, ge=0)
    """Its hardware FLOPs utilisation at the measured step time: the FLOPs its devices
    executed (recomputation included, fused causal attention's half of the scores) over the
    peak; what the error bands hold a prediction's rate against. None in a file written before
    runs kept it."""
    communication_share: Float = Field(default=0.0, ge=0, le=1)
    """The share of its predicted step that was communication left exposed
    (:func:`planner.cost.regimes.communication_share`): how much of its error the price of
    that communication may explain."""
