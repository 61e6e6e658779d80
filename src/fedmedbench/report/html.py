"""Tables for the HTML report: each study's Markdown table (already rounded as its paper prints
it) as a small self-contained HTML page, and one short caption per table.

The CSV next to each table keeps full precision for analysis; the report shows what a reader of
the paper would compare against, so it embeds this formatted version instead of the raw CSV.
"""

from __future__ import annotations

import html
import re

#: short captions by table name (without the _synthetic tag); {x} = the part of the name it names
_CAPTIONS: list[tuple[str, str]] = [
    (r"final_metrics", "Final-round metrics (%), mean ± std over seeds, per dataset, setting and method."),
    (r"table1_params", "UltraFlwr Table I: parameters of each YOLO11n part and what partial aggregation saves."),
    (r"table1_(?P<x>.+)", "GPAF paper Table 1 layout, {x}: accuracy, macro F1, recall and precision (%) of every method."),
    (r"convergence_rounds", "GPAF paper: rounds each method needs to reach the target accuracy."),
    (r"top_strategies_(?P<x>.+)", "UltraFlwr Tables II/III, group {x}: the top strategies per setting and metric."),
    (r"communication", "Communication per client and round (what each strategy sends)."),
    (r"table1", "Early-stopping paper Table 1: metric at the data-free stop minus the best validation-based stop."),
    (r"table2", "Early-stopping paper Table 2: the bad configuration at tau = 0.1 (metric, r*, differences)."),
    (r"table(?P<x>[3-9])", "FedST paper Table {x} (Dice / IoU in %, or cost)."),
]


def table_caption(study: str, table: str) -> str:
    """One line saying what the table is (the page itself carries the full caption)."""
    name = re.sub(r"_synthetic$", "", table)
    if study == "fedst" and name == "table2":
        return "FedST paper Table II: sites A-D and their average, personalised models on each site's test clips."
    for pattern, text in _CAPTIONS:
        m = re.fullmatch(pattern, name)
        if m:
            return text.format(**m.groupdict())
    return f"Table {name}."


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _is_rule(line: str) -> bool:
    return bool(re.fullmatch(r"\|?\s*:?-{2,}:?\s*(\|\s*:?-{2,}:?\s*)*\|?", line.strip()))


def markdown_to_html(text: str, title: str) -> str:
    """Paragraphs, '#' headings and pipe tables of a table writer's Markdown, as one HTML page."""
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
            body.append(f"<table><thead><tr>{th}</tr></thead><tbody>{trs}</tbody></table>")
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
    style = ("body{font-family:sans-serif;font-size:14px;margin:1em}table{border-collapse:collapse;margin:.5em 0}"
             "th,td{border:1px solid #bbb;padding:3px 8px;text-align:right}th{background:#eee}"
             "td:first-child,th:first-child{text-align:left}p{max-width:60em}")
    return (f"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{style}</style></head><body>{''.join(body)}</body></html>\n")
