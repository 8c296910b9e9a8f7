"""What a run of a plan records: each step's result, the plan's, and where they are written.

A run on a lent GPU box can be cut off from outside at any moment, so the records are kept as
plain dataclasses that `plan.json` is rewritten from after every step (atomically, so a
reader never sees half a file), and `RunContext.write` puts every line of `plan-log.txt` on
disk as soon as it is written. Steps, archiving and the runner all report through here.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO, TextIO

LOG_FILE = "plan-log.txt"
JSON_FILE = "plan.json"

OK, FAILED, TIMEOUT, SKIPPED = "ok", "failed", "timeout", "skipped"


def now() -> str:
    """The time, in UTC to the second, as the log and plan.json give starts."""
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass
class StepResult:
    """What one step did; `exit_code` is negative when a signal ended it (-15 SIGTERM)."""

    name: str
    command: str
    status: str = SKIPPED
    exit_code: int | None = None
    started: str | None = None
    duration_s: float = 0.0
    limit_s: float | None = None
    note: str = ""
    archived: list[str] = field(default_factory=list)


@dataclass
class PlanResult:
    """A finished run of a plan: every step's result, in plan order."""

    name: str
    path: Path
    out_dir: Path
    budget_s: float
    git: dict[str, Any]
    started: str
    duration_s: float = 0.0
    steps: list[StepResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(step.status == OK for step in self.steps)

    @property
    def status(self) -> str:
        return OK if self.ok else FAILED

    def to_json(self) -> dict[str, Any]:
        return {
            "plan": self.name,
            "path": str(self.path),
            "out_dir": str(self.out_dir),
            "status": self.status,
            "budget_s": self.budget_s,
            "commit": self.git.get("commit"),
            "git": self.git,
            "started": self.started,
            "duration_s": round(self.duration_s, 3),
            "steps": [
                asdict(step) | {"duration_s": round(step.duration_s, 3)} for step in self.steps
            ],
        }

    def table(self) -> str:
        """A few lines to read last on a console: each step's status, exit, time and files."""
        done = sum(step.status == OK for step in self.steps)
        lines = [
            f"plan {self.name}: {done} of {len(self.steps)} steps ok in {self.duration_s:.1f} s "
            f"(budget {self.budget_s:g} s); log {self.out_dir / LOG_FILE}",
            f"  {'step':<24} {'status':<8} {'exit':>5} {'seconds':>8} {'files':>6}  note",
        ]
        for s in self.steps:
            code = "" if s.exit_code is None else str(s.exit_code)
            lines.append(
                f"  {s.name:<24} {s.status:<8} {code:>5} {s.duration_s:>8.1f} "
                f"{len(s.archived):>6}  {s.note}".rstrip()
            )
        return "\n".join(lines)


def write_json(result: PlanResult) -> None:
    """`plan.json` in the output folder, replaced whole so it is never read half-written."""
    path = result.out_dir / JSON_FILE
    tmp = path.with_name("." + path.name + ".tmp")
    tmp.write_text(json.dumps(result.to_json(), indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


@dataclass
class RunContext:
    """Where a run happens (the folder steps start in, the output folder, the SIGTERM to
    SIGKILL grace) and where its log goes: the open plan-log.txt, and the console if echoed."""

    root: Path
    out_dir: Path
    log: BinaryIO
    echo: TextIO | None
    grace_s: float

    def write(self, text: str) -> None:
        """Append to the log and flush at once, so a run cut off still leaves its log."""
        self.log.write(text.encode())
        self.log.flush()
        if self.echo is not None:
            self.echo.write(text)
            self.echo.flush()
