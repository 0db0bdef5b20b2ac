"""``planner profile``'s measurements: the shapes a search needs (:func:`profile_cases`) and
their layers run on one device with PyTorch (:func:`run_profile`), which it imports only when
asked to run.

Each case builds its kind's layer at its shard on the device, from the planner's faithful
layers (:mod:`planner.diagnose.faithful_layers`), Hugging Face's
(:mod:`planner.diagnose.hf_layers`) or torchtitan's (:mod:`planner.diagnose.titan_layers`): a
:class:`LayerCode`. It runs with fp32 weights under autocast for a 16-bit precision (PyTorch
AMP, what the ``hf-eager`` and ``hf-compiled`` stacks run), with its parameters in the 16-bit
precision itself on ``torchtitan-eager`` and ``colossalai-hf`` (FSDP2's gathered weights,
Colossal-AI's cast model), or in fp32, compiled with ``torch.compile`` on ``hf-compiled``. Its
forward is timed with autograd recording (what training runs), its backward as forward with
backward less the forward, each the fastest of several batches of calls
(:func:`~planner.diagnose.bench_torch.fastest_seconds`). The bytes it keeps are counted as
autograd saves them (``torch.autograd.graph.saved_tensors_hooks``: every distinct storage a
forward saves for the backward, the parameters' and buffers' own not counted), so they do not
depend on the device's allocator. A case that does not fit the device's memory is skipped and
listed. Last, AdamW's step over one decoder layer's parameters, as the stack keeps them.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Protocol

from planner.diagnose.bench_torch import (
    Backend,
    describe_device,
    fastest_seconds,
    synchronizer,
)
from planner.errors import InputError
from planner.graph.stacks import AUTOCAST_STACKS
from planner.spec import ModelSpec
from planner.spec.layers import MoESpec
from planner.spec.profile import (
    LayerMeasurement,
    OptimizerMeasurement,
    SkippedShape,
    shard_label,
)
from planner.vocabulary import COMPILED_STACKS, Precision, Stack

PROFILED_STACKS: tuple[Stack, ...] = ("hf-eager", "hf-compiled", "torchtitan-eager",
                                      "torchtitan-compiled", "colossalai-hf")  # fmt: skip
"""The stacks layers run as: PyTorch eager under autocast and each layer compiled (the faithful
layer's and Hugging Face's), torchtitan's block eager and compiled (its head, whose loss
torchtitan compiles, compiled whole) and Hugging Face's layers eager in the compute
precision."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfileCase:
    """One layer kind at one shard and microbatch."""

    kind: str
    """``embedding``, ``dense``, ``moe`` (an MoE layer around its routed experts),
    ``experts`` (one rank's routed experts) or ``head``."""
    tensor_parallel: int
    """The tensor-parallel shard: heads, KV heads, FFN and vocabulary divided by it (for
    ``experts``, each expert's FFN: the expert tensor-parallel shard)."""
    micro_batch_size: int
    """Sequences in the microbatch (of each rank, for ``experts``)."""
    seq_length: int
    """Tokens per sequence."""
    expert_parallel: int = 1
    """For ``experts``: the routed experts divided by it, their tokens those of as many
    ranks' microbatches."""

    @property
    def label(self) -> str:
        """``dense tp2 1x4096``, ``experts tp1 ep4 2x4096``."""
        return shard_label(self.kind, self.tensor_parallel, self.expert_parallel,
                           self.micro_batch_size, self.seq_length)  # fmt: skip


def profile_cases(
    model: ModelSpec, *, seq_length: int, tensor_parallel: Sequence[int],
    micro_batches: Sequence[int], expert_parallel: Sequence[int] = (1,),
) -> tuple[list[ProfileCase], list[SkippedShape]]:  # fmt: skip
    """Every layer kind of ``model`` at each tensor-parallel degree that divides its heads, KV
    heads, FFN and vocabulary, and each microbatch; an MoE model's routed experts at each
    expert-parallel degree that divides them too; the kinds and degrees the faithful layers
    cannot run, listed with why.

    >>> from planner.spec.reading import load_model
    >>> cases, skipped = profile_cases(load_model("tests/data/bench/tiny-llama.json"),
    ...                                seq_length=256, tensor_parallel=(1, 2, 4),
    ...                                micro_batches=(1,))
    >>> [c.label for c in cases][:3]
    ['embedding tp1 1x256', 'dense tp1 1x256', 'head tp1 1x256']
    >>> skipped[0].reason
    'tp 4 does not divide 2 KV heads'
    >>> moe, _ = profile_cases(load_model("tests/data/bench/tiny-moe.json"), seq_length=256,
    ...                        tensor_parallel=(1,), micro_batches=(1,), expert_parallel=(1, 4))
    >>> [c.label for c in moe]
    ['embedding tp1 1x256', 'dense tp1 1x256', 'moe tp1 1x256', 'head tp1 1x256', \
'experts tp1 ep1 1x256', 'experts tp1 ep4 1x256']
    """
    kinds = ["embedding", *_decoder_kinds(model), "head"]
    skipped: list[SkippedShape] = []
    cases = []
    for t in tensor_parallel:
        why = _indivisible(model, t)
        for m in micro_batches:
            if why is not None:
                skipped.append(SkippedShape(kind="dense", tensor_parallel=t, micro_batch_size=m,
                                            seq_length=seq_length, reason=why))  # fmt: skip
                continue
            cases += [ProfileCase(kind=k, tensor_parallel=t, micro_batch_size=m,
                                  seq_length=seq_length) for k in kinds]  # fmt: skip
    if model.moe is not None:
        for e, t, m in itertools.product(expert_parallel, tensor_parallel, micro_batches):
            shard = dict(kind="experts", tensor_parallel=t, expert_parallel=e,
                         micro_batch_size=m, seq_length=seq_length)  # fmt: skip
            # the planner runs experts at the layer's TP or folded at 1: a TP the layer
            # cannot take is no expert shard either
            why = _indivisible(model, t) or _experts_indivisible(model.moe, t, e)
            if why is None:
                cases.append(ProfileCase(**shard))  # type: ignore[arg-type]
            else:
                skipped.append(SkippedShape(**shard, reason=why))  # type: ignore[arg-type]
    return cases, skipped


def _decoder_kinds(model: ModelSpec) -> list[str]:
    """The decoder layer kinds ``model`` has, dense before MoE."""
    moe = [model.is_moe_layer(i) for i in range(model.num_layers)]
    return [k for k, present in (("dense", not all(moe)), ("moe", any(moe))) if present]


def _indivisible(model: ModelSpec, tp: int) -> str | None:
    groups = model.num_query_groups or model.num_attention_heads
    ffn = model.ffn_hidden_size or 4 * model.hidden_size
    for size, what in ((model.num_attention_heads, "heads"), (groups, "KV heads"),
                       (ffn, "FFN"), (model.vocab_size, "vocabulary entries")):
        if size % tp:
            return f"tp {tp} does not divide {size} {what}"
    return None


def _experts_indivisible(moe: MoESpec, tp: int, ep: int) -> str | None:
    if moe.num_experts % ep:
        return f"ep {ep} does not divide {moe.num_experts} experts"
    if moe.ffn_hidden_size % tp:
        return f"tp {tp} does not divide the experts' FFN of {moe.ffn_hidden_size}"
    return None


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfileRun:
    """What one run of the profile measured."""

    measured: tuple[LayerMeasurement, ...]
    """The cases that ran."""
    skipped: tuple[SkippedShape, ...]
    """The cases that did not (out of memory, no kernel), with the error."""
    optimizer: OptimizerMeasurement | None
    """AdamW's step over one decoder layer's parameters (None: it did not run)."""
    device_name: str
    """The device as its driver names it, or the CPU's model."""
    software: str
    """PyTorch's version (and CUDA's or the CPU threads)."""


class LayerCode(Protocol):
    """Whose layers a profile runs, each built at one shard (PyTorch modules):
    :class:`planner.diagnose.faithful_layers.FaithfulCode`,
    :class:`planner.diagnose.hf_layers.TransformersCode` or
    :class:`planner.diagnose.titan_layers.TorchtitanCode`."""

    name: str
    """What the profile records as its ``layer_code``."""

    def embedding(self, tensor_parallel: int) -> Any:
        """The embedding (token ids in)."""

    def layer(self, kind: str, tensor_parallel: int) -> Any:
        """A ``dense`` or ``moe`` decoder layer (``[batch, seq, hidden]`` in and out)."""

    def experts(self, tensor_parallel: int, expert_parallel: int,
                tokens: int) -> tuple[Any, tuple[int, ...]]:  # fmt: skip
        """A rank's routed experts and the shape of their input."""

    def head(self, tensor_parallel: int) -> Any:
        """The final norm, output layer and loss (hidden states and labels in; ``.vocab``)."""


class _Runner:
    """Builds, times and counts one case on one device."""

    def __init__(self, torch: Any, backend: Backend, precision: Precision, stack: Stack,
                 code: LayerCode, model: ModelSpec, repeats: int,
                 min_time_s: float) -> None:  # fmt: skip
        self.torch, self.code, self.model = torch, code, model
        self.device = torch.device(backend)
        self.sync = synchronizer(torch, backend)
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
        # Under autocast the weights stay fp32; torchtitan's FSDP2 gathers them in the compute
        # precision and Colossal-AI casts its model to it.
        self.autocast = precision != "fp32" and stack in AUTOCAST_STACKS
        self.weights = self.dtype if precision != "fp32" and not self.autocast else None
        self.compiled = stack in COMPILED_STACKS
        self.backend, self.repeats, self.min_time_s = backend, repeats, min_time_s

    def _amp(self) -> Any:
        if not self.autocast:
            return nullcontext()
        return self.torch.autocast(device_type=self.backend, dtype=self.dtype)

    def _placed(self, module: Any) -> Any:
        """``module`` on the device, its parameters in the compute precision where the stack
        holds its weights in it (FSDP2 casts the parameters alone: torchtitan's complex
        rotary frequencies stay complex)."""
        module = module.to(self.device)
        if self.weights is not None:
            for p in module.parameters():
                p.data = p.data.to(self.weights)
        return module

    def _input(self, *shape: int) -> Any:
        """Random hidden states of ``shape``: fp32 under autocast (the residual stream the
        autocast stacks run), else the weights' precision."""
        return self.torch.randn(*shape, device=self.device, dtype=self.weights,
                                requires_grad=True)  # fmt: skip

    def _pass(self, case: ProfileCase) -> tuple[Any, Callable[[], Any]]:
        """The case's module and a forward returning what its backward starts from."""
        torch, m, code, tp = self.torch, self.model, self.code, case.tensor_parallel
        tokens = (case.micro_batch_size, case.seq_length)
        if case.kind == "embedding":
            module = self._placed(code.embedding(tp))
            ids = torch.randint(0, module.vocab, tokens, device=self.device)
            return module, lambda: module(ids)
        shape: tuple[int, ...] = (*tokens, m.hidden_size)
        if case.kind == "head":
            module = self._placed(code.head(tp))
            labels = torch.randint(0, module.vocab, tokens, device=self.device)
            x = self._input(*shape)
            run = torch.compile(module) if self.compiled else module
            return module, lambda: run(x, labels)
        if case.kind == "experts":
            module, shape = code.experts(tp, case.expert_parallel,
                                         case.micro_batch_size * case.seq_length)  # fmt: skip
        else:
            module = code.layer(case.kind, tp)
        module = self._placed(module)
        x = self._input(*shape)
        run = torch.compile(module) if self.compiled else module
        return module, lambda: run(x)

    def measure(self, case: ProfileCase) -> LayerMeasurement:
        """Forward and backward seconds and kept bytes of ``case``."""
        module, forward = self._pass(case)

        def step() -> None:
            with self._amp():
                out = forward()
            out.float().sum().backward()

        def forward_only() -> None:
            with self._amp():
                forward()

        time = {"repeats": self.repeats, "min_time_s": self.min_time_s}
        both = fastest_seconds(step, self.sync, **time)
        alone = fastest_seconds(forward_only, self.sync, **time)
        module.zero_grad(set_to_none=True)
        return LayerMeasurement(
            kind=case.kind, tensor_parallel=case.tensor_parallel,
            expert_parallel=case.expert_parallel, micro_batch_size=case.micro_batch_size,
            seq_length=case.seq_length,
            forward_s=alone, backward_s=max(both - alone, 1e-3 * both),
            kept_bytes=self._kept_bytes(module, forward))  # fmt: skip

    def optimizer(self) -> OptimizerMeasurement:
        """AdamW's step over a whole decoder layer's parameters (an MoE layer's with its
        routed experts), as the stack keeps them (fp32 under AMP, in fp32, and under FSDP2's
        mixed precision, whose sharded weights are fp32: fused where the device has the
        kernel)."""
        torch = self.torch
        kind = _decoder_kinds(self.model)[0]
        modules = [self.code.layer(kind, 1)]
        if kind == "moe":
            modules.append(self.code.experts(1, 1, 1)[0])
        params = [p for module in modules for p in module.to(self.device).parameters()]
        for p in params:
            p.grad = torch.randn_like(p)
        try:
            optimizer = torch.optim.AdamW(params, lr=1e-4, fused=True)
            optimizer.step()
        except (RuntimeError, TypeError):  # no fused kernel on this device
            optimizer = torch.optim.AdamW(params, lr=1e-4, foreach=True)
        seconds = fastest_seconds(optimizer.step, self.sync, repeats=self.repeats,
                                  min_time_s=self.min_time_s)  # fmt: skip
        return OptimizerMeasurement(parameters=sum(p.numel() for p in params), step_s=seconds)

    def _kept_bytes(self, module: Any, forward: Callable[[], Any]) -> float:
        """Bytes of the distinct storages one forward saves for its backward, parameters' and
        buffers' (constants such as rotary frequencies) apart."""
        params = {p.untyped_storage().data_ptr()
                  for p in (*module.parameters(), *module.buffers())}  # fmt: skip
        seen: dict[int, int] = {}

        def pack(t: Any) -> Any:
            storage = t.untyped_storage()
            if storage.data_ptr() not in params:
                seen[storage.data_ptr()] = storage.nbytes()
            return t

        with self.torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), self._amp():
            out = forward()
        del out
        return float(sum(seen.values()))


def run_profile(
    model: ModelSpec, cases: Sequence[ProfileCase], *, torch: Any, backend: Backend,
    precision: Precision, stack: Stack, repeats: int = 5, min_time_s: float = 0.05,
    on_case: Callable[[int, ProfileCase], None] | None = None, code: LayerCode | None = None,
) -> ProfileRun:  # fmt: skip
    """Measure every case on ``backend`` with ``torch``, built by ``code`` (default: the
    planner's faithful layers); a case the device has no memory for is skipped with its
    error, the rest still run. ``on_case(i, case)`` is told before each."""
    if stack not in PROFILED_STACKS:
        raise InputError(f"--stack {stack}: the layers run as "
                         f"{' or '.join(PROFILED_STACKS)}")  # fmt: skip
    if code is None:
        from planner.diagnose.faithful_layers import FaithfulCode

        code = FaithfulCode(model)
    runner = _Runner(torch, backend, precision, stack, code, model, repeats, min_time_s)
    measured, skipped = [], []
    for i, case in enumerate(cases):
        if on_case is not None:
            on_case(i, case)
        try:
            measured.append(runner.measure(case))
        except (RuntimeError, NotImplementedError) as exc:  # out of memory, no kernel
            skipped.append(SkippedShape(kind=case.kind, tensor_parallel=case.tensor_parallel,
                                        expert_parallel=case.expert_parallel,
                                        micro_batch_size=case.micro_batch_size,
                                        seq_length=case.seq_length,
                                        reason=str(exc).splitlines()[0][:120]))  # fmt: skip
            if backend == "cuda":
                torch.cuda.empty_cache()
    try:
        optimizer = runner.optimizer()
    except (RuntimeError, NotImplementedError):  # out of memory
        optimizer = None
    name, software = describe_device(torch, backend)
    return ProfileRun(measured=tuple(measured), skipped=tuple(skipped), optimizer=optimizer,
                      device_name=name, software=software)  # fmt: skip
