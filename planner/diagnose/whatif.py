"""Hardware what-ifs: the cluster with one thing changed, for :func:`~planner.diagnose.explain.
explain` to price the same plan on.

Each is a new :class:`~planner.spec.ClusterSpec` (specs are frozen), checked by the spec's own
rules: twice the bandwidth of every network level outside the scale-up domain (the NICs and
switches between nodes), twice the device memory (the reserved memory as it was), and a
scale-up domain twice as wide (an NVLink domain spanning twice the devices, absorbing an outer
level it reaches).

>>> from planner.spec.reading import load_cluster
>>> a100 = load_cluster("instances/clusters/dgx-a100-80gb.json")
>>> [change for change, _ in hardware_changes(a100)]
['2x infiniband bandwidth (25 -> 50 GB/s)', '2x HBM (80 -> 160 GiB)', \
'nvlink domain 8 -> 16 devices']
"""

from __future__ import annotations

from pydantic import ValidationError

from planner.spec import ClusterSpec


def hardware_changes(cluster: ClusterSpec) -> list[tuple[str, ClusterSpec]]:
    """The hardware changes that apply to ``cluster``, each in words with the changed
    cluster: faster scale-out, more memory, a wider scale-up domain (when the cluster has
    more than one domain)."""
    changes = []
    outer = cluster.network[1:]
    if outer:
        names = ", ".join(level.name for level in outer)
        rates = ", ".join(f"{level.bandwidth_gb_s:g} -> {2 * level.bandwidth_gb_s:g}"
                          for level in outer)  # fmt: skip
        faster = tuple(level.model_copy(update={"bandwidth_gb_s": 2 * level.bandwidth_gb_s})
                       for level in outer)  # fmt: skip
        changes.append((f"2x {names} bandwidth ({rates} GB/s)",
                        cluster.model_copy(update={"network": (cluster.network[0], *faster)})))
    memory = cluster.device.memory_gib
    device = cluster.device.model_copy(update={"memory_gib": 2 * memory})
    changes.append((f"2x HBM ({memory:g} -> {2 * memory:g} GiB)",
                    cluster.model_copy(update={"device": device})))  # fmt: skip
    wider = wider_scale_up(cluster)
    if wider is not None:
        changes.append(wider)
    return changes


def wider_scale_up(cluster: ClusterSpec) -> tuple[str, ClusterSpec] | None:
    """The scale-up domain twice as wide, an outer level it reaches or passes absorbed; None
    when the domain already holds the cluster or the outer levels cannot hold the wider
    domain whole."""
    inner = cluster.network[0]
    domain = 2 * inner.domain_devices
    if inner.domain_devices >= cluster.num_devices:
        return None
    kept = tuple(level for level in cluster.network[1:] if level.domain_devices > domain)
    absorbed = [level.name for level in cluster.network[1:] if level.domain_devices <= domain]
    data = cluster.model_dump()
    # A level wider than the cluster only says "everything": it grows to hold whole domains.
    kept = tuple(level if level.domain_devices % domain == 0
                 or level.domain_devices < cluster.num_devices
                 else level.model_copy(update={"domain_devices": -(-level.domain_devices
                                                                   // domain) * domain})
                 for level in kept)  # fmt: skip
    data["network"] = [inner.model_copy(update={"domain_devices": domain}).model_dump(),
                       *(level.model_dump() for level in kept)]  # fmt: skip
    try:
        wider = ClusterSpec.model_validate(data)
    except ValidationError:
        return None
    text = f"{inner.name} domain {inner.domain_devices} -> {domain} devices"
    if absorbed:
        text += f" (replacing {', '.join(absorbed)})"
    return text, wider
