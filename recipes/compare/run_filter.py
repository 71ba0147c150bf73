"""``recipes compare --filter``: MLflow's search syntax, plus numeric comparisons of params.

The filter is MLflow's ``search_runs(filter_string=...)`` syntax (``metrics.`val/acc` > 0.9``, ``params.lr =
'0.01'``, ``tags.`loopwise.fit_run_id` = '...'``, ``datasets.digest = '...'``, ``attributes.status = 'FINISHED'``,
clauses joined with ``and``). MLflow stores params as text and refuses ``params.lr > 0.001`` ("Expected a quoted
string value"), so a clause comparing a param with an unquoted number (``<``, ``<=``, ``>``, ``>=``, ``=``, ``!=``)
is taken out of the string sent to MLflow and applied here, numerically: a run whose param is missing or not a
number does not match it. Everything else goes to MLflow, which reports a bad filter (turned into one error line).
"""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from recipes.compare.errors import CompareError

NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
PARAM_KEY = r"(?:`(?P<q1>[^`]+)`|\"(?P<q2>[^\"]+)\"|(?P<bare>[\w.\-/]+))"
PARAM_CLAUSE = re.compile(
    rf"^params\.{PARAM_KEY}\s*(?P<op><=|>=|!=|<|>|=)\s*(?P<num>{NUMBER})$",
    re.IGNORECASE,
)
AND = re.compile(r"\s+and\s+", re.IGNORECASE)
OPERATORS: dict[str, Callable[[float, float], bool]] = {
    "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge, "=": operator.eq, "!=": operator.ne,
}


def split_clauses(text: str) -> list[str]:
    """The ``and``-separated clauses of a filter, never splitting inside quotes or backticks."""
    clauses, current, quote, i = [], [], "", 0
    while i < len(text):
        joint = None if quote else AND.match(text, i)
        if joint:
            clauses.append("".join(current).strip())
            current, i = [], joint.end()
            continue
        char = text[i]
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"`":
            quote = char
        current.append(char)
        i += 1
    clauses.append("".join(current).strip())
    return [c for c in clauses if c]


@dataclass(frozen=True)
class NumericParamClause:
    """``params.<key> <op> <number>``, compared as numbers here."""

    key: str
    op: str
    value: float

    def matches(self, params: dict[str, str]) -> bool:
        """True when the run's param is a number and the comparison holds."""
        try:
            return OPERATORS[self.op](float(params[self.key]), self.value)
        except (KeyError, ValueError):
            return False


@dataclass(frozen=True)
class RunFilter:
    """A parsed ``--filter``: the part MLflow evaluates and the numeric param clauses evaluated here."""

    text: str = ""
    mlflow: str = ""
    numeric: tuple[NumericParamClause, ...] = field(default_factory=tuple)

    def keeps(self, run: Any) -> bool:
        """True when the run matches every numeric param clause."""
        return all(clause.matches(run.data.params) for clause in self.numeric)

    def combined_with(self, clause: str) -> str:
        """The string for MLflow: ``clause`` (the stage) and the user's MLflow part."""
        return " and ".join(part for part in (clause, self.mlflow) if part)


def parse_filter(text: str | None) -> RunFilter:
    """Split ``--filter`` into MLflow's part and the numeric param clauses (see the module docstring)."""
    if not text or not text.strip():
        return RunFilter()
    if re.search(r"\s+or\s+", re.sub(r"'[^']*'|\"[^\"]*\"|`[^`]*`", "", text), re.IGNORECASE):
        raise CompareError(f"--filter {text!r}: MLflow's search syntax has no 'or'; join clauses with 'and'")
    mlflow_part: list[str] = []
    numeric: list[NumericParamClause] = []
    for clause in split_clauses(text.strip()):
        found = PARAM_CLAUSE.match(clause)
        if found:
            key = found.group("q1") or found.group("q2") or found.group("bare")
            numeric.append(NumericParamClause(key, found.group("op"), float(found.group("num"))))
        else:
            mlflow_part.append(clause)
    return RunFilter(text.strip(), " and ".join(mlflow_part), tuple(numeric))


__all__ = ["NumericParamClause", "RunFilter", "parse_filter", "split_clauses"]
