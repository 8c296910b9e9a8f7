"""ncu's own rule results (its "Est. Speedup" advice): the table NcuReport.rules() returns and a
one-row-per-launch overview of it.

A rule message runs to some 800 characters and a decode step's 134 launches carry over 900 of
them, so a page or text cannot show them all as one table: the overview says, launch by launch,
how many rules there are to act on and which promises most, and the messages are read launch by
launch (workbench.report.ncu_page folds each launch's into a `<details>` block).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import pandas as pd

from workbench.analysis.ncu_metrics import number
from workbench.analysis.ncu_module import ncu_report

LINK = re.compile(r"@(url|sass|source|section):([^@]*)@")  # ncu's rule-message links
RULE_COLUMNS = [
    "launch", "section", "rule", "type", "title", "message", "speedup_pct", "speedup_type",
]  # fmt: skip
SHOWN_RULES = ("optimization", "warning", "error")  # ncu rules that passed are left out


def plain(message: str) -> str:
    """A rule message without ncu's link markup: `@url:text:link@` and friends become text."""

    def text(match: re.Match) -> str:
        parts = match.group(2).split(":")
        return parts[0] if match.group(1) == "url" else parts[-1]

    return LINK.sub(text, message)


def rule_table(labels: Sequence[str], actions: Sequence) -> pd.DataFrame:
    """Every rule result with a message, of every launch, the largest estimated speedup first,
    in RULE_COLUMNS. `speedup_pct` is ncu's "Est. Speedup" (local: of this launch; global: of
    the run)."""
    rows = []
    for label, action in zip(labels, actions):
        for rule in action.rule_results():
            if not rule.has_rule_message():
                continue
            message = rule.rule_message()
            speedup = rule.speedup_estimation() if rule.has_speedup_estimation() else {}
            kind = ncu_report.SpeedupType(speedup["type"]).name.lower() if speedup else None
            rows.append(
                (label, rule.section_identifier(), rule.name(),
                 ncu_report.MsgType(message["type"]).name.lower(), message["title"],
                 plain(message["message"]), number(speedup.get("speedup")), kind)
            )  # fmt: skip
    frame = pd.DataFrame(rows, columns=RULE_COLUMNS)
    frame = frame.sort_values("speedup_pct", ascending=False, na_position="last", kind="stable")
    return frame.reset_index(drop=True)


def rule_name(rule: pd.Series) -> str:
    """What a reader calls a rule: its title where ncu gives one, with the rule's name."""
    return f"{rule['rule']}: {rule['title']}" if rule["title"] else str(rule["rule"])


def rules_overview(rules: pd.DataFrame, labels: Sequence[str]) -> pd.DataFrame:
    """One row per launch that has rules (in `labels`' order): how many to act on
    (optimization, warning, error), how many passed, the largest estimated speedup and its rule.
    `rules` is NcuReport.rules(), largest speedup first."""
    rows = {}
    for label, group in rules.groupby("launch", sort=False):
        shown = group[group["type"].isin(SHOWN_RULES)]
        top = shown.dropna(subset=["speedup_pct"]).head(1)
        rows[label] = {
            "rules to act on": len(shown),
            "passed": len(group) - len(shown),
            "largest est. speedup (%)": top["speedup_pct"].iloc[0] if len(top) else None,
            "its rule": rule_name(top.iloc[0]) if len(top) else "",
        }
    columns = ["rules to act on", "passed", "largest est. speedup (%)", "its rule"]
    table = pd.DataFrame.from_dict(rows, orient="index", columns=columns)
    table = table.reindex([label for label in labels if label in rows])
    table.index.name = "launch"
    return table
