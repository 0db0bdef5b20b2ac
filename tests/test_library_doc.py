"""docs/library.md's examples run as written, one after another (as a reader pastes them),
and say what the page says they say."""

from __future__ import annotations

import os
import re

from tests.conftest import REPO

PAGE = REPO / "docs" / "library.md"


def test_the_library_page_runs_as_written() -> None:
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.DOTALL)
    assert len(blocks) >= 3
    namespace: dict[str, object] = {}
    cwd = os.getcwd()
    os.chdir(REPO)  # the page's paths are the repository's
    try:
        for block in blocks:
            exec(compile(block, str(PAGE), "exec"), namespace)
    finally:
        os.chdir(cwd)
    result, batch, job = namespace["result"], namespace["batch"], namespace["job"]
    assert result.to_dict()["step_time_s"] == result.step_time_s  # type: ignore[attr-defined]
    assert batch.refusal(2).startswith("tp(3) x pp(8)")  # type: ignore[attr-defined]
    assert namespace["again"] == namespace["plan"]  # read back as written
    assert "--tensor-model-parallel-size" in job.text  # type: ignore[attr-defined]
