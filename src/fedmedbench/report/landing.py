"""The report's first page, built from the config: each study, its paper (if any), where its data come
from (official, user or synthetic), and its main table, so a reader sees the results without a click.

The workflow (rule ``report_landing``) writes it as an HTML fragment that the report's landing text
(``report/workflow.rst``) includes; the same fragment opens full width from the report's menu.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass, field

from fedmedbench.report import origin as ORIGIN
from fedmedbench.report.html import markdown_body

#: the papers a study can reproduce (by the kind of study), as the landing page names them
PAPERS = {
    "earlystop": "Beyond Fixed Rounds: data-free early stopping in federated learning",
    "gpaf": "GPAF (Lakrouni et al., 2025): domain shift across client imaging devices",
    "ultraflwr": "UltraFlwr: federated YOLO for surgical tool detection",
    "fedst": "FedST: personalised federated instrument part segmentation",
}
#: each kind of study's main table(s), by table name without the synthetic tag; a study without a paper: its final metrics
MAIN_TABLES = {
    "earlystop": [r"table1"],
    "gpaf": [r"table1_(?!params).+"],
    "ultraflwr": [r"top_strategies_.+"],
    "fedst": [r"table2"],
    None: [r"final_metrics"],
}
#: the data origins of a study, in the landing page's words
ORIGIN_WORDS = {
    "synthetic": "synthetic (a deterministic stand-in; its numbers reproduce no paper)",
    "real": "official (the public release, checksum-verified)",
}
#: the ``_synthetic`` tag of file names built from synthetic data
SYNTHETIC_TAG = "_synthetic"


@dataclass
class StudyEntry:
    """What the landing page says of one study (built by the workflow from the config)."""

    name: str
    paper: str | None  # a key of PAPERS, or None for a study of the user's own
    datasets: list[str]
    origin: str  # origin.parts() format: "synthetic", "real" and/or "user data: <path>", joined by "; "
    tables: list[str] = field(default_factory=list)  # paths of its Markdown tables that rule all builds


def main_tables(study: StudyEntry) -> list[str]:
    """The study's main table(s) among its tables: the paper's headline table, or its final metrics."""
    patterns = MAIN_TABLES.get(study.paper, MAIN_TABLES[None])
    out = []
    for path in study.tables:
        name = re.sub(rf"{SYNTHETIC_TAG}$", "", path.rsplit("/", 1)[-1].removesuffix(".md"))
        if any(re.fullmatch(p, name) for p in patterns):
            out.append(path)
    return out


def origin_kinds(origin: str) -> list[str]:
    """``official``, ``user`` and/or ``synthetic``: the kinds of data a study's tables come from."""
    kinds = []
    for part in ORIGIN.parts(origin):
        kind = "official" if part == "real" else "user" if part.startswith("user data") else part
        if kind not in kinds:
            kinds.append(kind)
    return kinds


def origin_text(origin: str) -> str:
    """The study's data origin in words: official, user data (with the file) or synthetic."""
    words = []
    for part in ORIGIN.parts(origin):
        if part.startswith("user data"):
            words.append(f"user data ({part.split(':', 1)[1].strip()})" if ":" in part else "user data")
        else:
            words.append(ORIGIN_WORDS.get(part, part))
    return "; ".join(words)


def landing_html(studies: list[StudyEntry], tables: dict[str, str], data_category: bool) -> str:
    """The landing fragment: one paragraph per study (paper, datasets, data origin), then each main table.

    ``tables``: Markdown text by path (the main tables, read by the rule); ``data_category``: whether
    the report has the surgical data statistics (category ``data``)."""
    out = ['<div class="fmb-landing">', _STYLE,
           "<p>Each study is one category in the menu, with its tables (rounded as printed; the CSVs in "
           "<code>results/&lt;study&gt;/tables/</code> keep full precision), figures and client partitions."
           + (" The category <b>data</b> holds the surgical data statistics per group and setting." if data_category else "")
           + "</p>", "<ul>"]
    for s in studies:
        paper = f"reproduces <i>{html.escape(PAPERS[s.paper])}</i>" if s.paper else "a study of your own (no paper)"
        out.append(f"<li><b>{html.escape(s.name)}</b>: {paper}; data: {html.escape(', '.join(s.datasets))}, "
                   f"{html.escape(origin_text(s.origin))}.</li>")
    out.append("</ul>")
    if any("synthetic" in origin_kinds(s.origin) for s in studies):
        out.append("<p><b>Synthetic data</b> are a deterministic stand-in for a quick run: numbers and figures built "
                   "from them are NOT a reproduction of any paper, and their captions and file names say so.</p>")
    for s in studies:
        for path in main_tables(s):
            if path in tables:
                out.append(f"<h3>{html.escape(s.name)}: {html.escape(path.rsplit('/', 1)[-1].removesuffix('.md'))}</h3>")
                out.append(markdown_body(tables[path]))
    out.append("</div>")
    return "\n".join(out) + "\n"


# scoped to the fragment: the report's own page keeps its styles. The report's home view centres its content
# vertically (a blank band above a short text), holds the text in a narrow column (max-w-lg) next to the rule
# graph, and its typography style prints backticks around <code>; the rules with :has() undo these only on the
# page that holds this fragment: the text starts at the top, full width, with the rule graph below it.
_STYLE = ("<style>.fmb-landing table{border-collapse:collapse;margin:.3em 0;font-size:12px}"
          ".fmb-landing th,.fmb-landing td{border:1px solid #bbb;padding:2px 6px;text-align:right;white-space:nowrap}"
          ".fmb-landing th{background:#eee}.fmb-landing td:first-child,.fmb-landing th:first-child{text-align:left}"
          ".fmb-scroll{overflow-x:auto;max-width:100%}"
          ".fmb-landing code::before,.fmb-landing code::after{content:none}"
          "div.items-center:has(.fmb-landing){align-items:flex-start}"
          "div.items-start:has(> div .fmb-landing){flex-direction:column;align-items:stretch;min-width:0}"
          "div:has(> .prose .fmb-landing),.prose:has(.fmb-landing){max-width:none;min-width:0}</style>")
