"""How much more than its share the busiest expert-parallel rank routes in a layer.

Dropless routing (no capacity factor) sends each expert what the router picks: with a trained
router and a load-balancing loss the experts' loads spread around their mean, and every
expert-parallel rank waits, at the layer's all-to-alls, for the rank whose local experts drew
the most tokens. That rank's grouped GEMMs and its share of the exchange set the layer's time.

The spread is one number, the coefficient of variation ``cv`` (standard deviation over mean)
of one layer's tokens per expert, a property of the router and the data, not of the plan.
Routing fixes the layer's total (``tokens x top_k``), so a rank holding ``k`` of the ``E``
experts sums ``k`` loads drawn without replacement from it, and the ``n = E / k`` ranks' sums
add up to that total: the busiest exceeds the mean rank by ``cv sqrt(n / (E - 1))`` times the
expected maximum of ``n`` standard normals (the finite population correction ``(E - k) / (E -
1)`` and the ranks' fixed sum ``n / (n - 1)`` taken together; one rank holding every expert is
always balanced). That maximum is Blom's approximation of normal order statistics (G. Blom,
*Statistical Estimates and Transformed Beta-Variables*, 1958), ``Phi^-1((n - 0.375) / (n +
0.25))``, within 0.03 of the exact values for the 2-256 ranks expert parallelism uses; routing
drawn at random checks the whole within 2 % (``tests/test_expert_load.py``). The loads are taken
as independent but for their fixed total: experts a router picks together are not modelled.

``cv = 0`` is balanced routing, as Megatron-Core routes under
``--moe-router-force-load-balancing`` (``megatron/core/transformer/moe/router.py`` draws the
scores at random, ``apply_random_logits`` in ``moe_utils.py``: balanced up to sampling noise)
and as NVIDIA's MoE recipes benchmark.
"""

from __future__ import annotations

import math
from statistics import NormalDist


def expected_max_normal(n: int) -> float:
    """The expected largest of ``n`` independent standard normals (Blom's approximation).

    >>> round(expected_max_normal(1), 3), round(expected_max_normal(8), 3)
    (0.0, 1.434)
    """
    if n <= 1:
        return 0.0
    return NormalDist().inv_cdf((n - 0.375) / (n + 0.25))


def busiest_rank_load(*, experts: int, expert_parallel: int, cv: float) -> float:
    """The tokens the busiest of ``expert_parallel`` ranks routes, over the mean rank's, when
    each of ``experts`` experts' loads varies by ``cv`` (see the module docstring).

    >>> busiest_rank_load(experts=128, expert_parallel=8, cv=0.0)
    1.0
    >>> round(busiest_rank_load(experts=128, expert_parallel=8, cv=0.5), 3)
    1.18
    >>> round(busiest_rank_load(experts=128, expert_parallel=32, cv=0.5), 3)
    1.519
    >>> busiest_rank_load(experts=128, expert_parallel=1, cv=0.5)
    1.0
    """
    if cv <= 0 or expert_parallel <= 1 or experts <= 1:
        return 1.0
    spread = cv * math.sqrt(expert_parallel / (experts - 1))
    return 1.0 + spread * expected_max_normal(expert_parallel)
