"""The progress bars of a search on stderr: per method, how far it is, the time it took and
the time it has left, and the best step so far; under it, the candidate it is searching."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import timedelta

from rich.console import Console, RenderableType
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Column
from rich.text import Text

from planner.options import Progress as SearchProgress
from planner.options import ProgressFn


class TimeLeftColumn(ProgressColumn):
    """``eta 0:00:07``, from the pace so far; ``eta ?`` until there is one."""

    def render(self, task: Task) -> Text:
        left = task.time_remaining
        if task.finished:
            left = 0.0
        shown = "?" if left is None else str(timedelta(seconds=round(left)))
        return Text(f"eta {shown}", style="progress.remaining")


class SearchBars(Progress):
    """A line per method: the method, the bar (which takes what the other columns leave), done
    of total, elapsed, eta, best step; then, indented, the candidate it is searching. The
    columns but the bar never wrap or shrink, so the best step and the eta stay whole."""

    def __init__(self, console: Console) -> None:
        whole = {"table_column": Column(no_wrap=True)}
        super().__init__(
            TextColumn("searching ({task.description})", **whole),  # type: ignore[arg-type]
            BarColumn(bar_width=None, table_column=Column(ratio=1, min_width=4)),
            MofNCompleteColumn(table_column=Column(no_wrap=True)),
            TimeElapsedColumn(table_column=Column(no_wrap=True)),
            TimeLeftColumn(table_column=Column(no_wrap=True)),
            TextColumn("{task.fields[best]}", **whole),  # type: ignore[arg-type]
            console=console, transient=True, expand=True,
            # Not on a terminal (a log, a pipe) a bar only leaves a blank line behind.
            disable=not console.is_terminal,
        )  # fmt: skip

    def get_renderables(self) -> Iterable[RenderableType]:
        for task in self.tasks:
            yield self.make_tasks_table([task])
            if task.fields.get("searching"):
                yield Text(f"  {task.fields['searching']}", style="dim")


@contextmanager
def search_bars(console: Console) -> Iterator[Callable[[str], ProgressFn]]:
    """Transient progress bars on ``console``, one per method searched, each fed by its
    search's progress callback."""
    bars = SearchBars(console)
    with bars:

        def start(method: str) -> ProgressFn:
            task = bars.add_task(method, total=None, best="", searching="")

            def update(p: SearchProgress) -> None:
                best = f"best {p.best_step_s:.3f} s" if p.best_step_s is not None else "best -"
                bars.update(task, completed=p.done, total=p.total, best=best,
                            searching=p.searching)  # fmt: skip

            return update

        yield start
