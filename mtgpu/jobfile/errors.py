"""The one exception the job-file readers raise (#MTGPU and #SBATCH alike)."""

from __future__ import annotations

_MAX_VALUE_IN_MESSAGE = 80


class JobFileError(ValueError):
    """A job file or command-line directive that cannot be accepted.

    `line` is 1-based (None for command-line overrides and direct calls of
    `parse_gpus`/`parse_array`); `directive` and `value` are what was written
    (None where the line could not be split into key=value); `problem` is the
    message without the location."""

    def __init__(self, problem: str, *, line: int | None = None, directive: str | None = None, value: str | None = None):
        self.problem = problem
        self.line = line
        self.directive = directive
        self.value = value
        super().__init__(self._render())

    def _render(self) -> str:
        parts = []
        if self.line is not None:
            parts.append(f"line {self.line}")
        elif self.directive is not None:
            parts.append("command line")
        if self.directive is not None:
            shown = self.value if self.value is not None else ""
            if len(shown) > _MAX_VALUE_IN_MESSAGE:
                shown = shown[:_MAX_VALUE_IN_MESSAGE] + "..."
            parts.append(f'{self.directive}="{shown}"' if self.value is not None else self.directive)
        parts.append(self.problem)
        return ": ".join(parts)

    def __reduce__(self):  # keep the attributes across pickling (multiprocessing, logging)
        return (_rebuild_error, (self.problem, self.line, self.directive, self.value))


def _rebuild_error(problem, line, directive, value) -> JobFileError:
    return JobFileError(problem, line=line, directive=directive, value=value)
