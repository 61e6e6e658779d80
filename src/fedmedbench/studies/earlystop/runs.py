"""Which outputs the early-stopping report adds to a MedMNIST study, and its config checks.

A study gets the report with ``early_stopping.report: true``; the runs themselves are the
study's ordinary ones (rules/common.smk), the report only reads their per-round logs.
"""

from __future__ import annotations

from typing import Any

from fedmedbench.config.check import config_error


def check_config(sname: str, study: dict[str, Any]) -> None:
    """The settings the report names must be settings of the study."""
    es = study["early_stopping"]
    if es["bad_setting"] and es["bad_setting"] not in study["settings"]:
        config_error(f"studies.{sname}.early_stopping.bad_setting", f"'{es['bad_setting']}' is not a setting of the study")
    if es["figure3_setting"] and es["figure3_setting"] not in study["settings"]:
        config_error(f"studies.{sname}.early_stopping.figure3_setting", f"'{es['figure3_setting']}' is not a setting of the study")


def taus(study: dict[str, Any]) -> list[float]:
    """Every tau the report evaluates (sweep, study tau, Table 2 tau)."""
    es = study["early_stopping"]
    return sorted({*es["taus"], es["tau"], es["table2_tau"]})


def figure_setting(study: dict[str, Any]) -> str:
    """The setting Fig. 3 shows: ``figure3_setting``, else the study's first."""
    return study["early_stopping"]["figure3_setting"] or next(iter(study["settings"]))


def targets(sname: str, study: dict[str, Any], tag: str) -> list[str]:
    """Tables 1 (and 2 with a bad setting) and Figs. 3-4 of study ``sname``; none without the report."""
    es = study["early_stopping"]
    if not es["report"]:
        return []
    out = [f"results/{sname}/tables/table1{tag}.{ext}" for ext in ("csv", "md", "tex")]
    if es["bad_setting"]:
        out += [f"results/{sname}/tables/table2{tag}.{ext}" for ext in ("csv", "md", "tex")]
    out += [f"results/{sname}/figures/fig3_stopping{tag}.png", f"results/{sname}/figures/fig4_tau{tag}.png"]
    return out
