"""Fuzzing the readers with malformed inputs: every damaged model, Hugging Face config,
cluster, plan or calibration file is read (and used) or refused with a one-line PlannerError,
never another exception. The strategies and the property are ``tests/fuzzing.py``'s; the longer
run is ``benchmarks/fuzz_inputs.py``."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import needs_shared
from tests.fuzzing import PROPERTIES, Property, damaged_text

CI_CASES = 150
"""Cases per property: 12 s for all five on the 2-core machine under load (measured),
derandomized so that CI always runs the same cases."""


@pytest.mark.parametrize(
    "prop",
    [pytest.param(p, marks=needs_shared(p.shared) if p.shared else ()) for p in PROPERTIES],
    ids=lambda prop: prop.kind,
)
def test_malformed_input_is_read_or_a_planner_error(prop: Property) -> None:
    """The property is :meth:`tests.fuzzing.Property.check`: it returns for an accepted input
    or a PlannerError and raises anything else."""

    @settings(max_examples=CI_CASES, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])  # fmt: skip
    @given(st.data())
    def run(data: st.DataObject) -> None:
        prop.check(data.draw(damaged_text(prop.kind)))

    run()
