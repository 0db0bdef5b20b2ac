"""Timing the bench's cases with PyTorch, on a CUDA GPU, an Ascend NPU (``torch_npu``) or the
CPU: the only module of the package that needs PyTorch, and it imports it only when asked to
run (``pip install 'planner[bench]'``).

Each case runs twice to warm up, then in ``repeats`` batches of as many calls as fill
``min_time_s``, with the device synchronised after each batch; its time is the fastest batch's
per-call time: what else runs on the machine (another process on the CPU's cores, a
descheduled launch thread) only ever slows a batch down, and a training job has the device to
itself. Back-to-back calls are what a training step runs, so the smallest kernels'
times are their launch cost, as the cost model's ``kernel_launch_us`` means it.

A rank's routed experts run as ``torch._grouped_mm`` on CUDA (torchtitan's kernel), elsewhere
as one ``torch.bmm`` of the same shapes. Attention is the fused kernel each platform trains
with: PyTorch's
``scaled_dot_product_attention`` (FlashAttention-2 or cuDNN on CUDA in bf16/fp16), and on
Ascend ``torch_npu.npu_fusion_attention`` with a causal mask given as MindSpeed gives it:
``sparse_mode=2`` and a 2048 x 2048 upper-triangular mask
(Ascend/MindSpeed@028de58ca629 ``mindspeed/core/transformer/flash_attention/generate_mask/
adaptor.py`` and ``flash_attention/adaptor.py``, the ``npu_fusion_attention`` call).
"""

from __future__ import annotations

import math
import platform
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from planner.diagnose.bench_cases import BenchCase
from planner.errors import InputError
from planner.spec import DeviceSpec
from planner.vocabulary import Precision

Backend = Literal["cuda", "npu", "cpu"]
DeviceChoice = Literal["auto", "cuda", "npu", "cpu"]

MAX_CALLS_PER_BATCH = 100_000
"""A bound on the calls in one timed batch (the tiniest kernels on a fast host)."""
NPU_CAUSAL_SPARSE_MODE = 2
"""``npu_fusion_attention``'s left-up causal mode, MindSpeed's for a causal mask."""
NPU_COMPRESSED_MASK = 2048
"""The side of the compressed causal mask that sparse mode 2 takes."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Timings:
    """What one run of the bench measured."""

    device_name: str
    """The device as its driver names it (``NVIDIA H100 80GB HBM3``), or the CPU's model."""
    backend: Backend
    """Where the kernels ran."""
    torch_version: str
    """PyTorch's version (and torch_npu's on Ascend)."""
    precision: Precision
    """The compute type of the tensors."""
    seconds: tuple[float | None, ...]
    """Per case, in the order given: the fastest batch's per-call seconds; None when it did
    not run."""
    skipped: tuple[str, ...] = ()
    """Why each case that did not run did not (its label and the error)."""


def import_torch(command: str = "planner bench", extra: str = "bench") -> Any:
    """PyTorch, or one line saying that ``command`` needs it and which extra installs it."""
    try:
        import torch
    except ImportError:
        raise InputError(f"{command} needs PyTorch; expected it installed: pip install "
                         f"'planner[{extra}]' (and torch_npu on Ascend)") from None  # fmt: skip
    return torch


def _npu(torch: Any) -> Any | None:
    """torch_npu when it is installed and sees a device (importing it adds ``torch.npu``)."""
    try:
        import torch_npu  # type: ignore[import-not-found]
    except ImportError:
        return None
    return torch_npu if torch.npu.is_available() else None


def backend_of(torch: Any, choice: DeviceChoice) -> Backend:
    """The device to run on: the one asked for, which must be there, or with ``auto`` an NPU,
    else a CUDA GPU, else the CPU."""
    if choice in ("auto", "npu") and _npu(torch) is not None:
        return "npu"
    if choice == "npu":
        raise InputError("--device npu: no Ascend device is visible; expected torch_npu "
                         "installed and an NPU (npu-smi info)")
    if choice in ("auto", "cuda") and torch.cuda.is_available():
        return "cuda"
    if choice == "cuda":
        raise InputError(f"--device cuda: PyTorch {torch.__version__} sees no CUDA device; "
                         f"expected a CUDA build of torch and a GPU (nvidia-smi)")
    return "cpu"


def choose_backend(device: DeviceChoice) -> Backend:
    """Where :func:`run_cases` will run for ``device``: the one named, which must be there, or
    with ``auto`` an NPU, else a CUDA GPU, else the CPU."""
    return backend_of(import_torch(), device)


PLATFORM_OF: dict[str, str | None] = {"cpu": None, "cuda": "cuda", "npu": "ascend"}
"""The platform (``device.platform``) each backend measures; the CPU is none of them."""


def check_measured(device: DeviceSpec, backend: Backend, *, what: str) -> None:
    """Refuse to keep measurements of ``backend`` under the name of a ``device`` of another
    platform: with no GPU visible, ``--device auto`` timed the CPU and ``--write`` put its
    numbers into the H100's file (its GEMM curve at 0.15 % of peak), or a profile named the
    H100 that ``--profile`` then priced with. A device without a platform (a file of the
    user's own machine) is not checked.

    >>> h100 = DeviceSpec(name="H100", memory_gib=80, memory_bandwidth_gb_s=3350,
    ...                   peak_tflops={"bf16": 989}, platform="cuda")
    >>> check_measured(h100, "cuda", what="--write")
    >>> check_measured(h100, "cpu", what="--write")
    Traceback (most recent call last):
    planner.errors.InputError: --write: this run times the CPU, not H100 (a cuda device, none \
visible here): its numbers would be kept under H100's name; run it where H100 is visible, or \
give a cluster file of this machine's CPU
    """
    platform = device.platform
    if platform is None or PLATFORM_OF[backend] == platform:
        return
    if backend == "cpu":
        times = f"the CPU, not {device.name} (a {platform} device, none visible here)"
        way = f"run it where {device.name} is visible, or give a cluster file of this machine's CPU"
    else:
        times = f"a {PLATFORM_OF[backend]} device, not {device.name} (a {platform} device)"
        way = "give a cluster file of the device it times"
    raise InputError(f"{what}: this run times {times}: its numbers would be kept under "
                     f"{device.name}'s name; {way}")


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def describe_device(torch: Any, backend: Backend) -> tuple[str, str]:
    """The device's name and the software's versions."""
    if backend == "cuda":
        return torch.cuda.get_device_name(), f"{torch.__version__}, CUDA {torch.version.cuda}"
    if backend == "npu":
        torch_npu = _npu(torch)
        return (torch.npu.get_device_name(),
                f"{torch.__version__}, torch_npu {getattr(torch_npu, '__version__', '?')}")
    threads = torch.get_num_threads()
    return _cpu_name(), f"{torch.__version__}, {threads} thread{'s' * (threads != 1)}"


class _Kernels:
    """Builds a callable per case on one device, its tensors allocated up front."""

    def __init__(self, torch: Any, backend: Backend, precision: Precision) -> None:
        self.torch = torch
        self.backend = backend
        self.device = torch.device(backend)
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16,
                      "fp32": torch.float32}[precision]  # fmt: skip

    def randn(self, *shape: int, grad: bool = False, dtype: Any = None) -> Any:
        return self.torch.randn(*shape, device=self.device, dtype=dtype or self.dtype,
                                requires_grad=grad)  # fmt: skip

    def build(self, case: BenchCase) -> Callable[[], object]:
        torch, f = self.torch, self.torch.nn.functional
        if case.kernel == "matmul":
            m, k, n = case.shape
            # A transposed operand is a transposed view of a tensor stored the other way, as
            # a framework hands it to the GEMM (no copy).
            a = self.randn(k, m).t() if case.transposed == "a" else self.randn(m, k)
            b = self.randn(n, k).t() if case.transposed == "b" else self.randn(k, n)
            out = self.randn(m, n)
            return lambda: torch.matmul(a, b, out=out)
        if case.kernel == "scaled_matmul":
            return self._scaled(case)
        if case.kernel == "grouped_matmul":
            return self._grouped(case)
        if case.kernel in ("attention_forward", "attention_backward"):
            return self._attention(case)
        if case.kernel == "adam":
            return self._adam(case.shape[0])
        rows, columns = case.shape
        x = self.randn(rows, columns)
        if case.kernel == "add":
            y, out = self.randn(rows, columns), self.randn(rows, columns)
            return lambda: torch.add(x, y, out=out)
        if case.kernel == "layer_norm":
            w, b = self.randn(columns), self.randn(columns)
            return lambda: f.layer_norm(x, (columns,), w, b)
        if case.kernel == "rms_norm":
            w = self.randn(columns)
            if self.backend == "npu":
                torch_npu = _npu(torch)
                return lambda: torch_npu.npu_rms_norm(x, w)[0]
            return lambda: f.rms_norm(x, (columns,), w)
        if case.kernel == "gelu":
            return lambda: f.gelu(x)
        if case.kernel == "silu":
            return lambda: f.silu(x)
        raise AssertionError(f"no kernel {case.kernel}")

    def _scaled(self, case: BenchCase) -> Callable[[], object]:
        """An FP8 GEMM as Transformer Engine's forward runs it: E4M3 operands with per-tensor
        scales, the second stored transposed, the output in the compute precision
        (``torch._scaled_mm``; a device without FP8 GEMMs raises, and the case is skipped)."""
        torch = self.torch
        e4m3 = getattr(torch, "float8_e4m3fn", None)
        scaled = getattr(torch, "_scaled_mm", None)
        if e4m3 is None or scaled is None:
            raise NotImplementedError(f"torch {torch.__version__} has no FP8 GEMM")
        m, k, n = case.shape
        a, b = self.randn(m, k).to(e4m3), self.randn(n, k).to(e4m3).t()
        one = torch.tensor(1.0, device=self.device)
        return lambda: scaled(a, b, scale_a=one, scale_b=one, out_dtype=self.dtype)

    def _grouped(self, case: BenchCase) -> Callable[[], object]:
        """A rank's experts as one grouped GEMM: ``torch._grouped_mm`` on CUDA (torchtitan's
        kernel, what the shared H100 measurements time), else one batched GEMM of the same
        shapes (``torch.bmm``: every expert the same tokens)."""
        torch = self.torch
        experts, tokens, k, n = case.shape
        weights = self.randn(experts, n, k).transpose(-2, -1)  # stored as nn.Linear stores it
        grouped = getattr(torch, "_grouped_mm", None)
        if self.backend == "cuda" and grouped is not None:
            x = self.randn(experts * tokens, k)
            ends = torch.arange(1, experts + 1, device=self.device, dtype=torch.int32) * tokens
            return lambda: grouped(x, weights, offs=ends)
        x = self.randn(experts, tokens, k)
        return lambda: torch.bmm(x, weights)

    def _attention(self, case: BenchCase) -> Callable[[], object]:
        torch = self.torch
        batch, heads, seq, head_dim = case.shape
        q, k, v = (self.randn(batch, heads, seq, head_dim, grad=True) for _ in range(3))
        if self.backend == "npu":
            torch_npu = _npu(torch)
            mask = torch.triu(torch.ones(NPU_COMPRESSED_MASK, NPU_COMPRESSED_MASK,
                                         dtype=torch.bool, device=self.device), diagonal=1)

            def forward() -> Any:
                return torch_npu.npu_fusion_attention(
                    q, k, v, heads, "BNSD", atten_mask=mask, scale=head_dim ** -0.5,
                    sparse_mode=NPU_CAUSAL_SPARSE_MODE)[0]  # fmt: skip
        else:
            def forward() -> Any:
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        if case.kernel == "attention_forward":
            def no_grad_forward() -> Any:
                with torch.no_grad():
                    return forward()
            return no_grad_forward
        out = forward()
        grad = torch.randn_like(out)
        return lambda: torch.autograd.grad(out, (q, k, v), grad, retain_graph=True)

    def _adam(self, params: int) -> Callable[[], object]:
        """Mixed-precision Adam as Megatron runs it: fp32 master weights, moments and
        gradients, then the compute-precision weights copied from the masters."""
        torch = self.torch
        master = torch.nn.Parameter(self.randn(params, dtype=torch.float32))
        master.grad = self.randn(params, dtype=torch.float32)
        weights = self.randn(params)
        try:
            optimizer = torch.optim.AdamW([master], lr=1e-4, fused=True)
            optimizer.step()
        except (RuntimeError, TypeError):
            optimizer = torch.optim.AdamW([master], lr=1e-4, foreach=True)

        def step() -> None:
            optimizer.step()
            weights.copy_(master)

        return step


def synchronizer(torch: Any, backend: Backend) -> Callable[[], None]:
    """What waits for ``backend``'s queued work to finish."""
    return {"cuda": torch.cuda.synchronize, "npu": lambda: torch.npu.synchronize(),
            "cpu": lambda: None}[backend]  # fmt: skip


def fastest_seconds(run: Callable[[], object], sync: Callable[[], None], *, repeats: int,
                    min_time_s: float) -> float:
    """Per-call seconds of the fastest of ``repeats`` batches, each long enough to time."""
    for _ in range(2):
        run()
    sync()
    start = time.perf_counter()
    run()
    sync()
    once = time.perf_counter() - start
    calls = max(1, min(MAX_CALLS_PER_BATCH, math.ceil(min_time_s / max(once, 1e-9))))
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            run()
        sync()
        samples.append((time.perf_counter() - start) / calls)
    return min(samples)


def run_cases(
    cases: Sequence[BenchCase],
    *,
    precision: Precision,
    device: DeviceChoice = "auto",
    repeats: int = 5,
    min_time_s: float = 0.02,
    on_case: Callable[[int, BenchCase], None] | None = None,
) -> Timings:
    """Time every case on ``device``; a case the device has no memory (or no kernel) for is
    skipped with its error, the rest still run. ``on_case(i, case)`` is told before each."""
    torch = import_torch()
    backend = backend_of(torch, device)
    name, version = describe_device(torch, backend)
    kernels = _Kernels(torch, backend, precision)
    sync = synchronizer(torch, backend)
    seconds: list[float | None] = []
    skipped: list[str] = []
    for i, case in enumerate(cases):
        if on_case is not None:
            on_case(i, case)
        try:
            seconds.append(fastest_seconds(kernels.build(case), sync, repeats=repeats,
                                           min_time_s=min_time_s))  # fmt: skip
        except (RuntimeError, NotImplementedError) as exc:  # out of memory, no kernel
            seconds.append(None)
            skipped.append(f"{case.label}: {str(exc).splitlines()[0][:120]}")
            if backend == "cuda":
                torch.cuda.empty_cache()
    return Timings(device_name=name, backend=backend, torch_version=version,
                   precision=precision, seconds=tuple(seconds), skipped=tuple(skipped))
