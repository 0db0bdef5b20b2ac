"""Uniform layer shardings as solutions beside the ILP's frontier.

The ILP walks a layer's time-memory frontier in a few budget steps, so a sharding between two
steps can be missed; Megatron's uniform shardings of a layer on the same mesh (every way its
axes can be tensor, context or data parallel, with and without sequence parallelism, the
experts on any of the non-tensor axes) are known points of the same space, priced by the same
functions (:func:`planner.sharding.uniform.uniform_layer`). Offering them to the pipeline pass
beside the frontier keeps the per-operator search (``any``) at least as good as every
framework's uniform configurations on the meshes it visits.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from planner.errors import ConfigError
from planner.ilp.backends import SolverReport
from planner.ilp.layer import LayerSolution, OpChoice
from planner.ilp.problem import LayerQuery
from planner.sharding.assignment import layer_parts
from planner.sharding.uniform import UniformLayout, UniformQuery, uniform_layer
from planner.spec import ClusterSpec, ModelSpec


def mesh_layouts(shape: tuple[int, ...], *, experts: bool) -> Iterator[UniformLayout]:
    """Every uniform layout of a mesh of ``shape``: the last axis tensor parallel or not, each
    other axis context (ring or Ulysses) or data parallel, sequence parallelism on or off with
    a tensor axis, and for mixtures of experts the experts on any set of the non-tensor axes.

    >>> len(list(mesh_layouts((2, 4), experts=False)))
    13
    """
    last = len(shape) - 1
    for tensor in (last, None):
        others = [a for a in range(len(shape)) if a != tensor and shape[a] > 1]
        for roles in itertools.product(("data", "context"), repeat=len(others)):
            sequence = tuple(a for a, r in zip(others, roles, strict=True) if r == "context")
            expert_sets = [()]
            if experts:
                expert_sets += [c for k in range(1, len(others) + 1)
                                for c in itertools.combinations(others, k)]  # fmt: skip
            ulysses = (False, True) if sequence else (False,)
            for sp in (True, False) if tensor is not None and shape[tensor] > 1 else (False,):
                for ep, all_to_all in itertools.product(expert_sets, ulysses):
                    yield UniformLayout(shape=shape, tensor_axis=tensor, sequence_axes=sequence,
                                        expert_axes=ep, sequence_parallel=sp,
                                        ulysses=all_to_all)  # fmt: skip


def uniform_solutions(
    model: ModelSpec, cluster: ClusterSpec, query: LayerQuery
) -> list[LayerSolution]:
    """The uniform shardings of ``query``'s layer on its mesh that divide, as solutions;
    ``query.mesh_micro_batch_size`` is the mesh's microbatch (split over its data axes)."""
    out = []
    for layout in mesh_layouts(query.mesh, experts=model.moe is not None):
        if query.mesh_micro_batch_size % layout.data_ways:
            continue
        uniform = UniformQuery(kind=query.kind, layout=layout,
                               micro_batch_size=query.mesh_micro_batch_size // layout.data_ways,
                               seq_length=query.seq_length, precision=query.precision,
                               stack=query.stack,
                               flash_attention=query.flash_attention,
                               tp_comm_overlap=query.tp_comm_overlap)  # fmt: skip
        try:
            layer = uniform_layer(model, cluster, uniform)
        except ConfigError:
            continue  # a dim the layout splits does not divide
        strategies = [n.strategies[0] for n in layer.nodes]
        choices = tuple(
            OpChoice(op=n.name, strategy=s.name, output=s.output,
                     followers=tuple(op.name for op in n.ops[1:]))
            for n, s in zip(layer.nodes, strategies, strict=True)
        )  # fmt: skip
        parts = layer_parts(layer, [0] * len(layer.nodes))
        report = SolverReport(backend="ortools", status="optimal", objective=None, bound=None,
                              gap=None, wall_s=0.0, num_variables=0,
                              num_constraints=0)  # fmt: skip
        out.append(LayerSolution(kind=query.kind, mesh=query.mesh, choices=choices, resharding=(),
                                 recompute=None, zero=None, time_s=None, memory_bytes=None,
                                 min_memory_bytes=None, report=report, parts=parts))  # fmt: skip
    return out
