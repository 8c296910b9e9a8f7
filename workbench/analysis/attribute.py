"""What was open on the host when each kernel was launched, and which rule that context picks.

A sweep over each host thread gives the *stack* at every launch: the record_function ranges,
the `nn.Module` scopes (traces taken `with_stack=True`) and the aten ops open at that moment,
outermost first. `Resolver` turns a stack and a kernel name into category, the rule that
decided it, phase, step, layer, op and module path, in the order `rules.py` documents.
Pure Python: no torch, no pandas.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

from workbench.analysis.rules import (
    ALL_REDUCE,
    DEFAULT_RULE,
    GRAPH_POSITION_RULE,
    LAYER_PATTERN,
    MODULE_EVENT,
    OPAQUE_RANGES,
    OTHER,
    PHASE_PATTERNS,
    Rule,
)
from workbench.errors import WorkbenchError

LAUNCH_CATS = {"cuda_runtime", "cuda_driver"}
RANGE_CATS = {"user_annotation"}
OP_CATS = {"cpu_op"}
PYTHON_CATS = {"python_function"}  # with_stack: `nn.Module: <Class>_<i>` among them

Kind = Literal["range", "module", "op", "launch"]


class Frame(NamedTuple):
    """One open host interval: its name (a module's class name), kind, and for a range the
    how-many-th range of that name it is on its thread (numbers step-less phase scopes)."""

    name: str
    kind: Kind
    occurrence: int = 0


Stack = tuple[Frame, ...]


class Resolved(NamedTuple):
    category: str
    source: str  # range, module, op, kernel or default: what kind of rule decided
    rule: str  # the deciding rule's name
    phase: str | None
    step: int | None
    layer: int | None
    op: str | None
    module: str | None  # module class path, outermost first, joined by "/"


@dataclass(slots=True)
class _Interval:
    """An open host interval, with what the sweep needs of everything around it carried along,
    so that an event reads its context from the innermost interval instead of the whole stack."""

    end: float
    frames: Stack  # the open frames, outermost first, ending in this interval's own
    opaque: bool  # this or an enclosing interval is an opaque range: no ops are rows inside
    op_row: int  # the innermost op at or around it: its index in the leaf bookkeeping, or -1


# At the bottom of every thread's stack, never popped (it ends after every event) nor changed.
_ROOT = _Interval(float("inf"), (), False, -1)


def _frame_of(event: dict, occurrences: dict[str, int]) -> Frame | None:
    """The stack frame an event opens, or None when it is not part of the stack."""
    cat = event.get("cat")
    name = event["name"]
    if cat in OP_CATS:
        return Frame(name, "op")
    if cat in RANGE_CATS:
        occurrences[name] = occurrences.get(name, -1) + 1
        return Frame(name, "range", occurrences[name])
    if cat in PYTHON_CATS:
        m = MODULE_EVENT.match(name)
        return Frame(m.group("cls"), "module") if m else None
    return None


def host_stacks(events: Sequence[dict]) -> tuple[dict[int, Stack], list[tuple[dict, Stack, float]]]:
    """Sweep each host thread once: the open frames at every launch, and every op.

    Returns (stack of each launch's correlation id, ending in the launch itself;
    [(op event, its stack ending in the op, self time in us)]). Self time excludes child ops,
    so summing it over ops counts every microsecond once. An opaque range (OPAQUE_RANGES) is
    one row of its whole duration instead of its ops.
    """
    by_thread: dict[tuple, list[dict]] = {}
    for e in events:
        cat = e.get("cat")
        module = cat in PYTHON_CATS and e["name"].startswith("nn.Module: ")
        if cat in RANGE_CATS or cat in OP_CATS or cat in LAUNCH_CATS or module:
            by_thread.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    launch_stacks: dict[int, Stack] = {}
    op_rows: list[tuple[dict, Stack, float]] = []
    for thread_events in by_thread.values():
        # Enclosing intervals first at equal start: longer first; launches after the rest.
        thread_events.sort(
            key=lambda e: (e["ts"], e.get("cat") in LAUNCH_CATS, -float(e.get("dur", 0)))
        )
        stack = [_ROOT]
        ops: list[dict] = []
        child_us: list[float] = []
        op_stacks: list[Stack] = []
        occurrences: dict[str, int] = {}
        for e in thread_events:
            ts = e["ts"]
            while stack[-1].end <= ts:
                stack.pop()
            outer = stack[-1]
            if e.get("cat") in LAUNCH_CATS:
                corr = (e.get("args") or {}).get("correlation")
                if corr is not None:
                    launch_stacks[corr] = (*outer.frames, Frame(e["name"], "launch"))
                continue
            frame = _frame_of(e, occurrences)
            if frame is None:
                continue
            dur = float(e.get("dur", 0))
            frames = (*outer.frames, frame)
            opaque = frame.kind == "range" and OPAQUE_RANGES.search(frame.name) is not None
            op_row = outer.op_row
            if opaque and not outer.opaque:
                op_rows.append((e, frames, dur))
            elif frame.kind == "op" and not outer.opaque:
                if op_row >= 0:  # the enclosing op's self time excludes this one
                    child_us[op_row] += dur
                op_row = len(ops)
                ops.append(e)
                child_us.append(0.0)
                op_stacks.append(frames)
            stack.append(_Interval(ts + dur, frames, outer.opaque or opaque, op_row))
        op_rows.extend(
            (op, st, max(float(op.get("dur", 0)) - child, 0.0))
            for op, st, child in zip(ops, op_stacks, child_us)
        )
    return launch_stacks, op_rows


@functools.lru_cache(maxsize=4096)
def structure(name: str) -> tuple[str | None, int | None, int | None]:
    """(phase, step, layer) a range's name gives, each None where it gives none."""
    phase = step = layer = None
    for pattern, fixed_phase in PHASE_PATTERNS:
        m = pattern.search(name)
        if m:
            groups = m.groupdict()
            phase = fixed_phase or (groups.get("phase") or "").lower() or None
            step = int(groups["step"]) if groups.get("step") else None
            break
    m = LAYER_PATTERN.search(name)
    if m:
        layer = int(m.group("layer") or m.group("module_layer"))
    return phase, step, layer


def _phase_and_step(stack: Stack) -> tuple[str | None, int | None]:
    """The innermost phase range gives the phase and, if its name has one, the step. A phase
    range without a step number takes its step from the outermost step-less range of that
    phase, by occurrence: "decode" scopes around each step number the steps, and a
    "decode_attention" scope inside them does not."""
    phases = [(f, *structure(f.name)[:2]) for f in stack if f.kind == "range"]
    phases = [(f, p, s) for f, p, s in phases if p is not None]
    if not phases:
        return None, None
    _, phase, step = phases[-1]
    if step is None:
        step = next(f.occurrence for f, p, s in phases if p == phase and s is None)
    return phase, step


class Resolver:
    """Resolves stacks to a `Resolved`, caching rule matches per name and results per stack
    and kernel name: a trace repeats them many times over (3 to 9 rows per distinct stack in
    100K-row traces), and each resolution walks the stack several times."""

    def __init__(self, rules: Sequence[Rule]):
        self.rules = list(rules)
        for rule in self.rules:
            if not isinstance(rule, Rule):
                raise WorkbenchError(
                    f"rules must be Rule objects, e.g. Rule('kernel', r'my_kernel', 'MoE'); "
                    f"got {rule!r}."
                )
        self._name_cache: dict[tuple[str, str], Rule | None] = {}
        self._resolved: dict[tuple[Stack, str, bool], Resolved] = {}

    def match(self, kind: str, name: str) -> Rule | None:
        """The first rule of `kind` whose pattern is found in `name` (or None)."""
        key = (kind, name)
        if key not in self._name_cache:
            self._name_cache[key] = next(
                (r for r in self.rules if r.match_on == kind and r.regex.search(name)), None
            )
        return self._name_cache[key]

    def resolve(self, stack: Stack, kernel_name: str, by_stack: bool = True) -> Resolved:
        """Category and what decided it, phase, step, layer, op and module path.

        With `by_stack` False (a kernel replayed from a CUDA graph, whose launch site is not
        where it was captured) the stack still gives phase and step, but only the kernel name
        gives the category. A phase range without a step number gets its occurrence as step.
        """
        key = (stack, kernel_name, by_stack)
        resolved = self._resolved.get(key)
        if resolved is None:
            resolved = self._resolved[key] = self._resolve(stack, kernel_name, by_stack)
        return resolved

    def _resolve(self, stack: Stack, kernel_name: str, by_stack: bool) -> Resolved:
        """`resolve` without the cache."""
        layer = op = None
        decided: tuple[Rule, str] | None = None
        for frame in reversed(stack):
            if frame.kind == "op" and op is None:
                op = frame.name
            if decided is None and frame.kind == "range" and by_stack:
                rule = self.match("range", frame.name)
                decided = (rule, "range") if rule else None
            if frame.kind == "range" and layer is None:
                layer = structure(frame.name)[2]
        phase, step = _phase_and_step(stack)
        modules = [f.name for f in stack if f.kind == "module"]
        module = "/".join(modules) if modules else None
        if decided is None and by_stack:
            decided = self._by_stack(stack, kernel_name, module)
        if decided is None:
            rule = self.match("kernel", kernel_name)
            decided = (rule, "kernel") if rule else None
        if decided is None:
            return Resolved(OTHER, "default", DEFAULT_RULE, phase, step, layer, op, module)
        rule, source = decided
        return Resolved(rule.category, source, rule.label, phase, step, layer, op, module)

    def _by_stack(
        self, stack: Stack, kernel_name: str, module: str | None
    ) -> tuple[Rule, str] | None:
        """Collectives (an op or kernel name whose first matching rule is All-reduce), then
        the module path, then the innermost op with a rule."""
        ops = [f.name for f in reversed(stack) if f.kind == "op"]
        for kind, name in [*(("op", n) for n in ops), ("kernel", kernel_name)]:
            rule = self.match(kind, name)
            if rule is not None and rule.category == ALL_REDUCE:
                return rule, kind
        if module is not None:
            rule = self.match("module", module)
            if rule:
                return rule, "module"
        for name in ops:
            rule = self.match("op", name)
            if rule:
                return rule, "op"
        return None


def recorded_rule(resolver: Resolver, source: str, category: str, name: str, op: str | None) -> str:
    """The deciding rule of a row saved before tables had a `rule` column, where the row
    itself shows it: the first rule of its kind that matches and gives its category."""
    if source == "default":
        return DEFAULT_RULE
    if source == "graph-position":
        return GRAPH_POSITION_RULE
    candidates = {
        "range": [r for r in resolver.rules if r.match_on == "range" and r.category == category],
        "kernel": [resolver.match("kernel", name)],
        "op": [resolver.match("op", op)] if isinstance(op, str) else [],
    }.get(source, [])
    found = [r for r in candidates if r is not None and r.category == category]
    return found[0].label if found else f"{source} (not recorded)"
