"""A backend-neutral mixed-integer linear program with integer coefficients.

Integer coefficients (nanoseconds, KiB) make both backends prove the same optimum exactly,
instead of two slightly different optima of rounded floats.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Sense = Literal["<=", "==", ">="]


@dataclass(frozen=True, slots=True, kw_only=True)
class Constraint:
    """``sum(coef * var) sense rhs``."""

    name: str
    """The row's name in the LP dump and in the CBC backends' models."""
    terms: tuple[tuple[str, int], ...]
    """(variable, integer coefficient) pairs (``add_constraint`` drops zero ones)."""
    sense: Sense
    """How the terms' sum compares to ``rhs``."""
    rhs: int
    """The integer the terms' sum is compared to."""


@dataclass(slots=True, kw_only=True)
class Milp:
    """Binary and bounded integer variables, linear constraints, a linear objective to minimise.

    A builder, not a value: the ``add_*`` methods append. Solvers read it, never change it.
    """

    name: str
    """The program's name (the LP dump's header, PuLP's problem)."""
    binaries: list[str] = field(default_factory=list)
    """The 0/1 variables' names, in the order added."""
    integers: dict[str, tuple[int, int]] = field(default_factory=dict)
    """The integer variables' (lower, upper) bounds by name."""
    constraints: list[Constraint] = field(default_factory=list)
    """The constraints, in the order added."""
    objective: dict[str, int] = field(default_factory=dict)
    """Each variable's integer coefficient in the objective to minimise (absent: 0)."""

    def add_binary(self, name: str) -> str:
        """A 0/1 variable."""
        self.binaries.append(name)
        return name

    def add_integer(self, name: str, lower: int, upper: int) -> str:
        """An integer variable in ``[lower, upper]``."""
        self.integers[name] = (lower, upper)
        return name

    def add_constraint(self, name: str, terms: dict[str, int], sense: Sense, rhs: int) -> None:
        """``terms sense rhs``; zero coefficients are dropped."""
        kept = tuple((v, c) for v, c in terms.items() if c != 0)
        self.constraints.append(Constraint(name=name, terms=kept, sense=sense, rhs=rhs))

    def minimise(self, terms: dict[str, int]) -> None:
        """Add ``terms`` to the objective."""
        for var, coef in terms.items():
            if coef:
                self.objective[var] = self.objective.get(var, 0) + coef

    @property
    def num_variables(self) -> int:
        """Binary plus integer variables."""
        return len(self.binaries) + len(self.integers)

    def to_lp(self) -> str:
        """The program in CPLEX LP format (for ``--dump-model``)."""

        def expr(terms: tuple[tuple[str, int], ...] | list[tuple[str, int]]) -> str:
            return " ".join(f"{c:+d} {v}" for v, c in terms) or "0"

        lines = [f"\\ {self.name}", "Minimize", f" obj: {expr(list(self.objective.items()))}",
                 "Subject To"]  # fmt: skip
        for c in self.constraints:
            lines.append(f" {c.name}: {expr(c.terms)} {c.sense} {c.rhs}")
        lines.append("Bounds")
        lines += [f" {lo} <= {v} <= {hi}" for v, (lo, hi) in self.integers.items()]
        lines += ["Binaries", *(f" {v}" for v in self.binaries)]
        lines += ["Generals", *(f" {v}" for v in self.integers), "End"]
        return "\n".join(lines) + "\n"
