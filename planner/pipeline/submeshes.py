"""The submesh shapes a pipeline stage may run on (Alpa, Zheng et al., OSDI'22, Sec. 5.2)."""

from __future__ import annotations


def submesh_shapes(num_nodes: int, devices_per_node: int) -> list[tuple[int, int]]:
    """Alpa's submesh shapes, as ``(nodes, devices on each)``: part of one node in powers of
    two, or whole nodes.

    >>> submesh_shapes(2, 8)
    [(1, 1), (1, 2), (1, 4), (1, 8), (2, 8)]
    """
    shapes = []
    m = 1
    while m < devices_per_node:
        shapes.append((1, m))
        m *= 2
    shapes += [(n, devices_per_node) for n in range(1, num_nodes + 1)]
    return shapes
