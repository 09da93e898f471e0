"""User-facing errors: what went wrong, where (file, node, field), and what to do.

The CLI turns any `OptschedError` into one message and exit status 2; everything
else is a bug and keeps its traceback.
"""

from __future__ import annotations


class OptschedError(Exception):
    """A mistake in the user's input, reported without a traceback."""

    def __init__(self, message: str, *, file: str | None = None, node: str | None = None,
                 field: str | None = None, hint: str | None = None):
        self.message = message
        self.file = file
        self.node = node
        self.field = field
        self.hint = hint
        super().__init__(self.render())

    def render(self) -> str:
        where = []
        if self.file:
            where.append(str(self.file))
        if self.node is not None:
            where.append(f"node {self.node!r}")
        if self.field:
            where.append(f"field {self.field!r}")
        text = (": ".join([", ".join(where), self.message]) if where else self.message)
        if self.hint:
            text += f" ({self.hint})"
        return text

    def in_file(self, file: str) -> OptschedError:
        """The same error, now naming the file it came from."""
        if self.file is None:
            self.file = str(file)
            self.args = (self.render(),)
        return self


class FormatError(OptschedError):
    """A file that is not valid JSON or does not follow its format."""


class GraphError(OptschedError):
    """A graph that breaks a structural rule (cycle, dangling input, bad size)."""


class ClusterError(OptschedError):
    """A cluster description that is inconsistent or names unknown devices."""


class InfeasibleError(OptschedError):
    """No schedule fits the budget; the message says how much would. `proven` False: the search found none (out
    of time, or over a restricted set of schedules: `restricted`, never proven), which does not prove there is
    none. `closest`: where the solver has one, its schedule with the smallest peak (over the budget), so that a
    caller can say at which budget a schedule was found. `least` (bytes): where known, the budget below which no
    schedule fits; `found` (bytes): the smallest peak of a schedule the solver found (over the budget); the two
    bracket the smallest budget that fits, for a caller reading `--json`."""

    def __init__(self, message: str, *, proven: bool = True, restricted: bool = False, closest=None,
                 least: int | None = None, found: int | None = None, **where):
        self.proven = proven and not restricted
        self.restricted = restricted
        self.closest = closest
        self.least = least
        self.found = found
        super().__init__(message, **where)

    @property
    def status(self) -> str:
        """The status a table shows: infeasible (proven), model_infeasible (the solver's restricted set has none)
        or no_incumbent (none found in time)."""
        return "infeasible" if self.proven else "model_infeasible" if self.restricted else "no_incumbent"

    def render(self) -> str:
        head = "no schedule fits" if self.proven else "no schedule found"
        return f"{head}: {super().render()}"
