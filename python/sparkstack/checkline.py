"""One check as one line, `pass  name: detail`: how preflight and verify print what they checked; and a dry
run's verdict over its checks, the last line it prints."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

STATUSES = ("pass", "warn", "fail", "skip")


def check_line(status: str, name: str, detail: str, where: str = "") -> str:
    """`status` is pass, warn, fail or skip; `where` an optional prefix such as `[rank 1 on local] `."""
    return f"{status:<4}  {where}{name}: {detail}"


@dataclass(frozen=True)
class Verdict:
    """What a dry run of `command` found: its checks counted by status, and what the real command would do. It
    starts when nothing fails (warns and skips do not stop it); `refusal` says what it does when something fails.
    The exit code is `nginx -t`'s: 0 when no check fails, 1 when one does."""

    command: str  # "sparkstack launch 0", as the user would run it for real
    counts: tuple[int, int, int, int]  # pass, warn, fail, skip
    first_fail: str = ""  # what fails first, in words (said after the verdict)
    refusal: str = "would not start"  # what the real command does when a check fails (up: "would stop at ...")

    @classmethod
    def of(cls, command: str, statuses: Iterable[str], first_fail: str = "",
           refusal: str = "would not start") -> Verdict:
        seen = list(statuses)
        unknown = sorted(set(seen) - set(STATUSES))
        if unknown:
            raise ValueError(f"not a check status: {', '.join(unknown)}")
        return cls(command, tuple(seen.count(s) for s in STATUSES), first_fail, refusal)  # type: ignore[arg-type]

    @property
    def ok(self) -> bool:
        return self.counts[2] == 0

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def line(self) -> str:
        counted = ", ".join(f"{n} {s}" for n, s in zip(self.counts, STATUSES))
        if self.ok:
            return f"preflight: {counted}: `{self.command}` would start"
        return f"preflight: {counted}: `{self.command}` {self.refusal}" + \
            (f" (first: {self.first_fail})" if self.first_fail else "")

    def to_json(self) -> dict:
        return {**dict(zip(STATUSES, self.counts)), "ok": self.ok, "exit_code": self.exit_code,
                "line": self.line()}
