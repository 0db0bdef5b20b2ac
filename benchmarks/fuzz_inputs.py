"""The readers on thousands of malformed inputs: every damaged model, Hugging Face config,
cluster, plan or calibration file must be read (and used) or refused with a one-line
PlannerError, never another exception.

The damaged files and the properties are ``tests/fuzzing.py``'s (the CI test runs 150 of each).
Each property runs ``--cases`` cases from one hypothesis seed; a case that breaks it is counted
and printed (the input, cut to 2,000 bytes, and the traceback), not shrunk, so one run reports
every failure. Run from the repository root:

    python benchmarks/fuzz_inputs.py                    # 10,000 cases per property
    python benchmarks/fuzz_inputs.py --cases 500 --seed 3
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.fuzzing holds the strategies


def run_property(prop_index: int, cases: int, seed: int) -> tuple[Counter[str], float, list[str]]:
    """``cases`` damaged inputs for property ``prop_index`` from hypothesis seed ``seed``:
    outcomes counted, the wall time, and every case that broke the property."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as with_seed
    from hypothesis import strategies as st

    from tests.fuzzing import PROPERTIES, damaged_text

    prop = PROPERTIES[prop_index]
    outcomes: Counter[str] = Counter()
    failures: list[str] = []

    @with_seed(seed)
    @settings(max_examples=cases, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(st.data())
    def case(data: st.DataObject) -> None:
        text = data.draw(damaged_text(prop.kind))
        try:
            outcomes[prop.check(text)] += 1
        except Exception:  # the property broke: record it and go on
            outcomes["other exception"] += 1
            failures.append(f"{prop.name}: {text[:2000]!r}\n{traceback.format_exc()}")

    started = time.perf_counter()
    case()
    return outcomes, time.perf_counter() - started, failures


def main() -> None:
    """Run every property and print one markdown row per property."""
    from tests.fuzzing import PROPERTIES

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=10_000, help="Cases per property.")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print("| property | cases | PlannerErrors | accepted | other exceptions | wall time |")
    print("|---|---|---|---|---|---|")
    broken: list[str] = []
    for index, prop in enumerate(PROPERTIES):
        outcomes, wall_s, failures = run_property(index, args.cases, args.seed)
        total = sum(outcomes.values())
        print(f"| {prop.name} | {total:,} | {outcomes['planner_error']:,} | "
              f"{outcomes['accepted']:,} | {outcomes['other exception']:,} | "
              f"{wall_s:.0f} s |", flush=True)  # fmt: skip
        broken += failures
    for failure in broken:
        print(f"\n{failure}", file=sys.stderr)


if __name__ == "__main__":
    main()
