"""What a layer profile changes in an operator's price: the factor, measured over priced, of
the layer it belongs to at the shard and microbatch it runs, read from the device's
``efficiency.profile`` (:class:`~planner.spec.profile.ProfileFactors`, set by
:func:`planner.sharding.profiled.with_profile`).

An operator takes its layer's factor at its own shard: the tensor-parallel ways its heads, FFN
or vocabulary are split, and the tokens it runs (its batch and sequence after every split). A
shape between measured microbatches takes the factor interpolated in log tokens, past them
the nearest one's; a sequence length between two measured ones, interpolated in log sequence
between them, past them the nearest one's. :func:`profile_coverage` says which, and past
:data:`REACH` times the measured range that the factor is extrapolated. A layer kind, tensor-
or expert-parallel shard the profile did not measure keeps the cost model's price.

An MoE layer's routed experts (:func:`profiled_kind` ``experts``: the operators that compute
on routed tokens, not a sequence's) take the factor of the ``experts`` measurement at their
expert-parallel and expert tensor-parallel shard, read along the rows the rank's experts
compute (:func:`routed_rows`) at any sequence length: the rest of the layer takes the ``moe``
measurement's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise

from planner.graph.lower import expert_capacity
from planner.graph.ops import TENSOR_PARALLEL_DIMS, Op
from planner.spec.layers import MoESpec
from planner.spec.profile import LayerFactor, ProfileFactors
from planner.vocabulary import Precision, Stack


@dataclass(frozen=True, slots=True, kw_only=True)
class Scale:
    """Multipliers on an operator's priced forward, backward and kept bytes."""

    forward: float
    """On its forward seconds."""
    backward: float
    """On its backward seconds (and the weight gradients' share of them)."""
    kept: float
    """On the bytes it keeps for the backward."""

    @classmethod
    def one(cls) -> Scale:
        """The cost model's price unchanged."""
        return cls(forward=1.0, backward=1.0, kept=1.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class Shard:
    """Which measurement an operator's price is read from."""

    kind: str
    """The layer kind (:attr:`planner.graph.ops.Op.layer_kind`)."""
    stack: Stack
    """The software that runs it."""
    precision: Precision
    """Its compute precision."""
    tensor_parallel: int
    """The ways its tensor-parallel dims are split."""
    micro_batch_size: int
    """Its sequences, after data parallelism (for ``experts``: the rows they compute)."""
    seq_length: int
    """Its tokens per sequence, after any sequence split (for ``experts``: 1)."""
    expert_parallel: int = 1
    """For ``experts``: the ways the routed experts are split."""

    @property
    def tokens(self) -> int:
        """Tokens it runs."""
        return self.micro_batch_size * self.seq_length


def profiled_kind(op: Op) -> str:
    """What a profile measured ``op`` as: ``experts`` for an operator computing on routed
    tokens (an expert's linears and activation; the dispatch and combine are the ``moe``
    layer's), else its layer kind.

    >>> from planner.graph.ops import Op, Tensor
    >>> rows = Tensor((("experts", 8), ("capacity", 64), ("ffn", 32)), 2.0)
    >>> profiled_kind(Op(name="l1.expert_act", kind="elementwise", layer=1, layer_kind="moe",
    ...                  inputs=(rows,), output=rows))
    'experts'
    """
    routed_compute = op.routed and op.kind not in ("dispatch", "combine")
    return "experts" if routed_compute else op.layer_kind


def routed_rows(moe: MoESpec, *, tokens: int, expert_parallel: int) -> int:
    """The rows one rank's experts compute when each of ``expert_parallel`` ranks routes
    ``tokens``: its ``num_experts / expert_parallel`` experts' capacity each, as the cost
    model lowers them (:func:`planner.graph.lower.expert_capacity`).

    >>> routed_rows(MoESpec(num_experts=8, top_k=2, ffn_hidden_size=64), tokens=4096,
    ...             expert_parallel=4)
    8192
    """
    local = moe.num_experts // expert_parallel
    return local * expert_capacity(tokens * expert_parallel, moe)


def _log_mix(a: float, b: float, at: float, lo: float, hi: float) -> float:
    if hi == lo:
        return a
    t = (math.log(at) - math.log(lo)) / (math.log(hi) - math.log(lo))
    return a + (b - a) * t


def _mix(a: Scale, b: Scale, at: float, lo: float, hi: float) -> Scale:
    return Scale(forward=_log_mix(a.forward, b.forward, at, lo, hi),
                 backward=_log_mix(a.backward, b.backward, at, lo, hi),
                 kept=_log_mix(a.kept, b.kept, at, lo, hi))  # fmt: skip


def _scale(f: LayerFactor) -> Scale:
    return Scale(forward=f.forward, backward=f.backward, kept=1.0 if f.kept is None else f.kept)


REACH = 4
"""How far past the measured microbatches (a factor in tokens), or past the measured sequence
lengths, the nearest one's factor is said to be held; further out it is still carried, and
said to be extrapolated. It is never dropped for the model's own price: where the profile
says the layers run slower than the model prices them, a shape priced by the model alone
would look cheaper than every measured one, and a search would choose it for that (it did:
an 8-sequence microbatch, on a profile of one)."""


def _along_tokens(points: Sequence[LayerFactor], tokens: int) -> tuple[Scale, str] | None:
    """The factor at ``tokens`` among one sequence length's measurements: interpolated
    between them, else the nearest one's (held within :data:`REACH` of it, extrapolated
    beyond); with how it was read. None without measurements."""
    ordered = sorted(points, key=lambda f: f.tokens)
    if not ordered:
        return None
    nearest = ordered[0] if tokens < ordered[0].tokens else ordered[-1]
    if not ordered[0].tokens <= tokens <= ordered[-1].tokens:
        held = ordered[0].tokens / REACH <= tokens <= ordered[-1].tokens * REACH
        return _scale(nearest), (f"{'held' if held else 'extrapolated'} from "
                                 f"{nearest.micro_batch_size}x{nearest.seq_length}")
    for lo, hi in pairwise(ordered):
        if lo.tokens <= tokens <= hi.tokens:
            how = "measured" if tokens in (lo.tokens, hi.tokens) else "interpolated"
            return _mix(_scale(lo), _scale(hi), tokens, lo.tokens, hi.tokens), how
    return _scale(nearest), "measured"  # a single measurement, at exactly these tokens


def read_scale(profile: ProfileFactors | None, shard: Shard) -> tuple[Scale, str] | None:
    """:func:`measured_scale` with how it was read (``measured``, ``interpolated``, ``held
    from 2x4096``, ``between sequences 2048 and 8192``, ``held from sequence 8192``)."""
    if profile is None or (profile.stack, profile.precision) != (shard.stack, shard.precision):
        return None
    by_seq: dict[int, list[LayerFactor]] = {}
    for f in profile.layers:
        if (f.kind, f.tensor_parallel, f.expert_parallel) == (
                shard.kind, shard.tensor_parallel, shard.expert_parallel):  # fmt: skip
            by_seq.setdefault(f.seq_length, []).append(f)
    if shard.kind == "experts":  # rows are rows whatever sequences they came from
        return _along_tokens([f for fs in by_seq.values() for f in fs], shard.tokens)
    if shard.seq_length in by_seq:
        return _along_tokens(by_seq[shard.seq_length], shard.tokens)
    below = [s for s in by_seq if s < shard.seq_length]
    above = [s for s in by_seq if s > shard.seq_length]
    if not by_seq:
        return None
    if not below or not above:  # past every measured length: the nearest's
        nearest = max(below) if below else min(above)
        held = max(nearest, shard.seq_length) <= REACH * min(nearest, shard.seq_length)
        found = _along_tokens(by_seq[nearest], shard.tokens)
        return None if found is None else (
            found[0], f"{'held' if held else 'extrapolated'} from sequence {nearest}")
    lo, hi = max(below), min(above)
    a, b = _along_tokens(by_seq[lo], shard.tokens), _along_tokens(by_seq[hi], shard.tokens)
    if a is None or b is None:
        return None
    return _mix(a[0], b[0], shard.seq_length, lo, hi), f"between sequences {lo} and {hi}"


def measured_scale(profile: ProfileFactors | None, shard: Shard) -> Scale | None:
    """The factors of ``shard`` in ``profile``: measured at its sequence length and
    interpolated in tokens (the nearest's past them), else interpolated between the two
    nearest measured sequence lengths around it, or the nearest length's; None where its
    kind and shard were not measured.

    >>> f = ProfileFactors(model="m", stack="hf-eager", precision="bf16", layers=[
    ...     LayerFactor(kind="dense", tensor_parallel=1, micro_batch_size=m, seq_length=s,
    ...                 forward=x, backward=x, kept=1.0)
    ...     for m, s, x in ((1, 2048, 1.2), (4, 2048, 1.4), (1, 8192, 1.6))])
    >>> at = Shard(kind="dense", stack="hf-eager", precision="bf16", tensor_parallel=1,
    ...            micro_batch_size=2, seq_length=2048)
    >>> round(measured_scale(f, at).forward, 3)  # halfway in log tokens
    1.3
    >>> at4k = Shard(kind="dense", stack="hf-eager", precision="bf16", tensor_parallel=1,
    ...              micro_batch_size=2, seq_length=4096)
    >>> round(measured_scale(f, at4k).forward, 3)  # 1.4 at 2,048 and 1.6 at 8,192
    1.5
    >>> at512 = Shard(kind="dense", stack="hf-eager", precision="bf16", tensor_parallel=1,
    ...               micro_batch_size=4, seq_length=512)  # a context-parallel shard
    >>> read_scale(f, at512)[1], round(measured_scale(f, at512).forward, 3)
    ('held from sequence 2048', 1.2)
    >>> measured_scale(f, Shard(kind="dense", stack="hf-eager", precision="bf16",
    ...                         tensor_parallel=2, micro_batch_size=1, seq_length=2048)) is None
    True
    """
    found = read_scale(profile, shard)
    return None if found is None else found[0]


def op_scale(
    profile: ProfileFactors | None, op: Op, split: Mapping[str, int], *, stack: Stack | None,
    precision: Precision,
) -> Scale:  # fmt: skip
    """The factors ``op`` is priced with when its dims are split as ``split`` (canonical dim
    names and ways): its layer's at its shard (:func:`measured_scale`), else none.

    >>> from planner.graph.ops import Op, Tensor
    >>> x = Tensor((("batch", 2), ("seq", 2048), ("hidden", 64)), 2.0)
    >>> norm = Op(name="layer1.norm", kind="norm", layer=1, layer_kind="dense", inputs=(x,),
    ...           output=x)
    >>> f = ProfileFactors(model="m", stack="hf-eager", precision="bf16", layers=[
    ...     LayerFactor(kind="dense", tensor_parallel=1, micro_batch_size=1, seq_length=2048,
    ...                 forward=1.5, backward=2.0)])
    >>> op_scale(f, norm, {"batch": 2}, stack="hf-eager", precision="bf16")
    Scale(forward=1.5, backward=2.0, kept=1.0)
    >>> op_scale(f, norm, {}, stack="hf-eager", precision="bf16")  # 2 x 2,048: held
    Scale(forward=1.5, backward=2.0, kept=1.0)
    >>> op_scale(f, norm, {}, stack="hf-compiled", precision="bf16")  # another stack's
    Scale(forward=1.0, backward=1.0, kept=1.0)
    """
    if profile is None or stack is None:
        return Scale.one()
    sizes = {name: size for t in (*op.inputs, op.output) for name, size in t.dims}
    tensor_parallel = max((split.get(d, 1) for d in TENSOR_PARALLEL_DIMS), default=1)
    if profiled_kind(op) == "experts":
        ep = split.get("experts", 1)
        rows = sizes["experts"] // ep * -(-sizes["capacity"] // split.get("capacity", 1))
        return measured_scale(profile, Shard(
            kind="experts", stack=stack, precision=precision, tensor_parallel=tensor_parallel,
            expert_parallel=ep, micro_batch_size=rows, seq_length=1)) or Scale.one()  # fmt: skip
    if "batch" not in sizes or "seq" not in sizes:
        return Scale.one()
    shard = Shard(kind=op.layer_kind, stack=stack, precision=precision,
                  tensor_parallel=tensor_parallel,
                  micro_batch_size=max(1, sizes["batch"] // split.get("batch", 1)),
                  seq_length=max(1, sizes["seq"] // split.get("seq", 1)))  # fmt: skip
    return measured_scale(profile, shard) or Scale.one()


def profile_coverage(
    profile: ProfileFactors | None, *, kinds: Sequence[str], stack: Stack,
    precision: Precision, tensor_parallel: int, micro_batch_size: int, seq_length: int,
    moe: MoESpec | None = None, expert_parallel: int = 1,
    expert_tensor_parallel: int | None = None,
) -> tuple[str, ...]:  # fmt: skip
    """One line per layer kind of a configuration: measured by the profile (at which shard),
    or priced by the model and why; empty without a profile. An MoE layer's routed experts
    (given ``moe``) have their own line, at ``expert_parallel`` and
    ``expert_tensor_parallel`` (default: ``tensor_parallel``).

    >>> f = ProfileFactors(model="m", stack="hf-eager", precision="bf16", layers=[
    ...     LayerFactor(kind="dense", tensor_parallel=1, micro_batch_size=1, seq_length=2048,
    ...                 forward=1.2, backward=1.2)])
    >>> profile_coverage(f, kinds=("dense", "head"), stack="hf-eager", precision="bf16",
    ...                  tensor_parallel=1, micro_batch_size=1, seq_length=2048)
    ('dense: measured (tp1 1x2048)', 'head: priced by the model (not profiled)')
    """
    if profile is None:
        return ()
    if (profile.stack, profile.precision) != (stack, precision):
        return (f"none: profiled on {profile.stack} in {profile.precision}, priced on {stack} "
                f"in {precision}",)  # fmt: skip
    shards = []
    for kind in kinds:
        shards.append(Shard(kind=kind, stack=stack, precision=precision,
                            tensor_parallel=tensor_parallel, micro_batch_size=micro_batch_size,
                            seq_length=seq_length))  # fmt: skip
        if kind == "moe" and moe is not None:  # its routed experts, at their own shard
            rows = routed_rows(moe, tokens=micro_batch_size * seq_length,
                               expert_parallel=expert_parallel)  # fmt: skip
            shards.append(Shard(kind="experts", stack=stack, precision=precision,
                                tensor_parallel=expert_tensor_parallel or tensor_parallel,
                                expert_parallel=expert_parallel, micro_batch_size=rows,
                                seq_length=1))  # fmt: skip
    lines = [_coverage_line(profile, shard) for shard in shards]
    if profile.optimizer is not None:
        lines.append("optimizer: measured")
    return tuple(lines)


def _coverage_line(profile: ProfileFactors, shard: Shard) -> str:
    """``dense: measured (tp1 1x2048)`` or ``head: priced by the model (why)``."""
    kind = shard.kind
    experts = kind == "experts"
    ep = f" ep{shard.expert_parallel}" if experts else ""
    size = f"{shard.micro_batch_size} rows" if experts else (
        f"{shard.micro_batch_size}x{shard.seq_length}")  # fmt: skip
    at = f"tp{shard.tensor_parallel}{ep} {size}"
    found = read_scale(profile, shard)
    if found is not None:
        how = found[1]
        return f"{kind}: measured ({at})" if how == "measured" else (
            f"{kind}: from the profile ({at}, {how})")  # fmt: skip
    measured = sorted((f.tensor_parallel, f.expert_parallel, f.seq_length, f.tokens)
                      for f in profile.layers if f.kind == kind)  # fmt: skip
    shapes = dict.fromkeys(f"tp{t} ep{e} {tokens} rows" if experts
                           else f"tp{t} {tokens // seq}x{seq}"
                           for t, e, seq, tokens in measured)  # fmt: skip
    why = f"{at} outside the profiled {', '.join(shapes)}" if shapes else "not profiled"
    return f"{kind}: priced by the model ({why})"


def optimizer_scale(profile: ProfileFactors | None) -> float:
    """What the optimizer step's priced seconds are multiplied by: the profile's measured
    over priced step (the same Adam over a decoder layer's parameters), else 1."""
    return 1.0 if profile is None or profile.optimizer is None else profile.optimizer
