"""Steps of an install or an uninstall, and running them.

A step is a description, a check whether it is already done, and an apply. `run_plan`
checks each step just before it would act (a step may depend on the ones before it),
applies the pending ones (`--yes`), or asks before each change, and says for every step
whether it was already done or what it did. A re-run of a finished plan changes nothing
and says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol


class SetupRefused(Exception):
    """Bad input or a state that cannot be used (an invalid config, a joiner without the
    secret): found before anything is changed. The message names the thing, the value
    and the fix. Exit status 2."""


class StepFailed(Exception):
    """A step's apply did not work; the message says what failed and what to do. Exit 1."""


@dataclass(frozen=True)
class Check:
    """The answer of a step's check: `done` (nothing to do) and, either way, what was found."""

    done: bool
    detail: str = ""


@dataclass
class Step:
    """One change: `title` says what it does ("write the init script /etc/init.d/mtgpu");
    `check()` says whether it is already done; `apply()` does it and returns what it did.
    `change=False` marks a step that changes nothing (waiting for the node): it is never
    asked about."""

    title: str
    check: Callable[[], Check]
    apply: Callable[[], str]
    change: bool = True


class Output(Protocol):
    def __call__(self, line: str) -> None: ...


Ask = Callable[[str], bool]


class SetupWork(Protocol):
    """An install or an uninstall: `preflight()` finds and checks everything (raising
    SetupRefused before any change), `summary()` the lines said first, `notes` warnings,
    `steps()` the plan, `kept` what was deliberately left in place (said at the end)."""

    notes: list[str]
    kept: list[str]

    def preflight(self) -> None: ...
    def summary(self) -> list[str]: ...
    def steps(self) -> list[Step]: ...


@dataclass
class PlanResult:
    applied: list[str] = field(default_factory=list)  # titles of the steps that were applied
    already: list[str] = field(default_factory=list)  # titles of the steps found done
    declined: str | None = None  # the title of the step the user said no to (the run stopped there)

    @property
    def changed(self) -> bool:
        return bool(self.applied)


def run_plan(steps: list[Step], *, yes: bool, ask: Ask, out: Output) -> PlanResult:
    """Run `steps` in order. With `yes` every pending change is applied; otherwise `ask`
    is called before each one, and a "no" stops the run there (later steps build on it).
    Raises StepFailed from a step's apply (the steps before it stay applied and say so)."""
    result = PlanResult()
    width = len(str(len(steps)))
    for number, step in enumerate(steps, 1):
        tag = f"[{number:>{width}}/{len(steps)}]"
        found = step.check()
        if found.done:
            result.already.append(step.title)
            out(f"{tag} {step.title}: already done" + (f" ({found.detail})" if found.detail else ""))
            continue
        if step.change and not yes:
            question = f"{tag} {step.title}" + (f" ({found.detail})" if found.detail else "") + "?"
            if not ask(question):
                result.declined = step.title
                out(f"{tag} {step.title}: not done (you said no); stopped here, the steps after it are not done either")
                return result
        try:
            what = step.apply()
        except StepFailed as e:
            raise StepFailed(f"{tag} {step.title}: {e}") from None
        result.applied.append(step.title)
        out(f"{tag} {step.title}: {what}" if what else f"{tag} {step.title}: done")
    if not result.applied:
        out("nothing changed: every step was already done")
    return result
