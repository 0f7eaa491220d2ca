"""Spec errors as values: every problem of a file, each with its location, code and texts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from pgflow_gen import naming
from pgflow_gen.words import counted


@dataclass(frozen=True)
class Location:
    """Where a problem is: file, 1-based line and column, and the YAML path (`steps[2].handler`)."""

    file: str
    line: int | None = None
    column: int | None = None
    path: str = ""

    def __str__(self) -> str:
        where = self.file
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        return where


@dataclass(frozen=True)
class Problem:
    """One error in a spec file."""

    code: str
    message: str
    location: Location
    detail: str | None = None
    hint: str | None = None
    flow_slug: str | None = None
    step_slug: str | None = None
    step_index: int | None = None

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        location = data.pop("location")
        return {
            "code": self.code,
            "file": location["file"],
            "line": location["line"],
            "column": location["column"],
            "path": location["path"],
            **{k: data[k] for k in ("flow_slug", "step_slug", "step_index")},
            "message": self.message,
            "detail": self.detail,
            "hint": self.hint,
        }

    def render(self, severity: str = "error") -> str:
        path = f" ({self.location.path})" if self.location.path else ""
        lines = [f"{self.location}: {severity}[{self.code}]{path}: {self.message}"]
        if self.detail:
            lines.append(f"  detail: {self.detail}")
        if self.hint:
            lines.append(f"  hint: {self.hint}")
        return "\n".join(lines)


class SpecErrors(naming.FlowSpecError):
    """Raised when a spec file has problems; `problems` lists all of them."""

    code = "invalid_spec"

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = tuple(problems)
        first = self.problems[0]
        super().__init__(
            f"{counted(len(self.problems), 'problem')} in {first.location.file}",
            detail=first.render(),
        )
