"""Tables for the HTML report: each study's Markdown table (already rounded as its paper prints
it) as a small self-contained HTML page, and one short caption per table.

The CSV next to each table keeps full precision for analysis; the report shows what a reader of
the paper would compare against, so it embeds this formatted version instead of the raw CSV.
"""

from __future__ import annotations

import html
import re

#: short captions by table name (without the _synthetic tag); {x} = the part of the name it names;
#: True where the table is one of a paper's (its values rounded as that paper prints them)
_CAPTIONS: list[tuple[str, str, bool]] = [
    (r"final_metrics", "Final-round metrics (%), mean ± std over seeds, per dataset, setting and method.", False),
    (r"table1_params", "UltraFlwr Table I: parameters of each YOLO11n part and what partial aggregation saves.", True),
    (r"table1_(?P<x>.+)", "GPAF paper Table 1 layout, {x}: accuracy, F1, recall and precision (%) of every method.", True),
    (r"convergence_rounds", "GPAF paper: rounds each method needs to reach the target accuracy.", True),
    (r"top_strategies_(?P<x>.+)", "UltraFlwr Tables II/III, group {x}: the top strategies per setting and metric.", True),
    (r"communication", "Communication per client and round (what each strategy sends).", False),
    (r"table1", "Early-stopping paper Table 1: metric at the data-free stop minus the best validation-based stop.", True),
    (r"table2", "Early-stopping paper Table 2: the bad configuration at tau = 0.1 (metric, r*, differences).", True),
    (r"table(?P<x>[3-9])", "FedST paper Table {x} (Dice / IoU in %, or cost).", True),
]


def _match(study: str, table: str) -> tuple[str, bool]:
    name = re.sub(r"_synthetic$", "", table)
    if study == "fedst" and name == "table2":
        return "FedST paper Table II: sites A-D and their average, personalised models on each site's test clips.", True
    for pattern, text, paper in _CAPTIONS:
        m = re.fullmatch(pattern, name)
        if m:
            return text.format(**m.groupdict()), paper
    return f"Table {name}.", False


def table_caption(study: str, table: str) -> str:
    """One line saying what the table is (the page itself carries the full caption)."""
    return _match(study, table)[0]


def table_rounding(study: str, table: str, has_paper: bool) -> str:
    """How the report's page rounds the table: as its paper prints it, only where the study has a paper
    and the table is one of the paper's; otherwise to two decimals, as the table writers do."""
    if has_paper and _match(study, table)[1]:
        return "Values rounded as the paper prints them"
    return "Values rounded to two decimals"


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _is_rule(line: str) -> bool:
    return bool(re.fullmatch(r"\|?\s*:?-{2,}:?\s*(\|\s*:?-{2,}:?\s*)*\|?", line.strip()))


def markdown_body(text: str) -> str:
    """Paragraphs, '#' headings and pipe tables of a table writer's Markdown, as HTML (no page around it).
    Each table sits in a box that scrolls sideways, so a wide table is never cut at the window's edge."""
    body: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.strip().startswith("|") and i + 1 < len(lines) and _is_rule(lines[i + 1]):
            head = _cells(line)
            rows = []
            i += 2
            while i < len(lines) and lines[i].strip().startswith("|"):
                rows.append(_cells(lines[i]))
                i += 1
            th = "".join(f"<th>{html.escape(c)}</th>" for c in head)
            trs = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
            body.append(f'<div class="fmb-scroll"><table><thead><tr>{th}</tr></thead><tbody>{trs}</tbody></table></div>')
            continue
        if line.startswith("#"):
            level = min(6, len(line) - len(line.lstrip("#")) + 1)
            body.append(f"<h{level}>{html.escape(line.lstrip('#').strip())}</h{level}>")
        elif line.strip():
            para = [line.strip()]
            while i + 1 < len(lines) and lines[i + 1].strip() and not lines[i + 1].strip().startswith(("|", "#")):
                i += 1
                para.append(lines[i].strip())
            body.append(f"<p>{html.escape(' '.join(para))}</p>")
        i += 1
    return "".join(body)


def markdown_to_html(text: str, title: str) -> str:
    """A table writer's Markdown as one self-contained HTML page (:func:`markdown_body` with its style)."""
    style = ("body{font-family:sans-serif;font-size:14px;margin:1em}table{border-collapse:collapse;margin:.5em 0}"
             "th,td{border:1px solid #bbb;padding:3px 8px;text-align:right;white-space:nowrap}th{background:#eee}"
             "td:first-child,th:first-child{text-align:left}p{max-width:60em}.fmb-scroll{overflow-x:auto;max-width:100%}")
    return (f"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{style}</style></head><body>{markdown_body(text)}</body></html>\n")
