"""The one error a devcontainer.json can raise, shared by the reader's modules."""

from __future__ import annotations

from dataclasses import dataclass

_MAX_VALUE_IN_MESSAGE = 80


@dataclass(frozen=True)
class Problem:
    """One thing wrong in a devcontainer.json: the key (dotted, `mounts[1]`), the value
    as written (None when the key is missing) and a message that says the fix."""

    key: str
    value: object
    message: str

    def render(self) -> str:
        if self.value is None:
            return f"{self.key}: {self.message}"
        shown = repr(self.value)
        if len(shown) > _MAX_VALUE_IN_MESSAGE:
            shown = shown[: _MAX_VALUE_IN_MESSAGE - 3] + "..."
        return f"{self.key} = {shown}: {self.message}"


class DevContainerError(ValueError):
    """A devcontainer.json this node cannot accept. `problems` lists every problem found
    (all of them at once, so one edit can fix them); `path` is the file, where known."""

    def __init__(self, problems: list[Problem] | tuple[Problem, ...], path: str | None = None):
        self.problems = tuple(problems)
        self.path = path
        super().__init__(self._render())

    @classmethod
    def one(cls, key: str, value: object, message: str, path: str | None = None) -> "DevContainerError":
        return cls([Problem(key, value, message)], path)

    def _render(self) -> str:
        where = f"{self.path}: " if self.path else ""
        if len(self.problems) == 1:
            return where + self.problems[0].render()
        lines = [f"{where}{len(self.problems)} problems:"]
        lines += [f"  - {p.render()}" for p in self.problems]
        return "\n".join(lines)
