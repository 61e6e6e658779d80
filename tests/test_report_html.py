"""The HTML report (`snakemake --report`): every study's section, rendered in headless Chromium.

A shrunken copy of the demo config (every study kind: quickstart, earlystop, gpaf, ultraflwr,
fedst; one or two rounds, tiny data) runs through the workflow, the report is built, and Chromium
renders it (the report is a JavaScript page: the categories exist only after it runs).
"""

from __future__ import annotations

import copy
import shutil
import subprocess
import sys
import zipfile

import pytest
import yaml
from helpers import ROOT, copy_workflow

from fedmedbench.report.html import markdown_to_html, table_caption

DEMO = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
STUDIES = ("quickstart", "earlystop", "gpaf", "ultraflwr", "fedst")


def tiny_demo(demo: dict) -> dict:
    """The demo config with every study kept but cut to the smallest run that still makes all its outputs."""
    cfg = copy.deepcopy(demo)
    cfg["device"] = "cpu"
    cfg["data"]["synthetic"].update(max_train=120, max_val=30, max_test=60)
    q = cfg["studies"]["quickstart"]
    q.update(datasets=["breastmnist"], seeds=[0], methods=["fedavg"], train={**q["train"], "rounds": 1},
             settings={"iid": {"scheme": "iid", "num_clients": 2}})
    e = cfg["studies"]["earlystop"]
    e.update(methods=["fedavg"], settings={k: e["settings"][k] for k in ("dir0.1", "dir0.1-badlr")},
             train={**e["train"], "rounds": 4})
    e["early_stopping"]["patience"] = 1
    g = cfg["studies"]["gpaf"]
    g.update(datasets=["breastmnist"], methods=["fedavg", "gpaf"], settings={"alpha0.5": g["settings"]["alpha0.5"]},
             train={**g["train"], "rounds": 1})
    g["method_params"] = {"gpaf": {"server_epochs": 1}}
    g["report"]["gpaf"]["tsne"] = {"methods": ["gpaf", "fedavg"], "samples_per_client": 10, "generator_samples": 10,
                                   "perplexity": 5}
    cfg["ultraflwr"].update(strategies=["FedAvg"], report={"top_k": 1},
                            train={**cfg["ultraflwr"]["train"], "rounds": 1, "epochs": 1})
    cfg["fedst"].update(methods=["seg_fedavg", "fedst"], variants=[], train={**cfg["fedst"]["train"], "rounds": 1},
                        fig5={"variants": []}, fig7={"methods": []})
    return cfg


def test_markdown_table_becomes_a_formatted_html_table():
    md = "Caption with 5 < 6.\n\n| method | acc |\n|:--|--:|\n| fedavg | 81.25 ± 1.02 |\n"
    page = markdown_to_html(md, "t")
    assert "<p>Caption with 5 &lt; 6.</p>" in page
    assert "<thead><tr><th>method</th><th>acc</th></tr></thead>" in page
    assert "<td>fedavg</td><td>81.25 ± 1.02</td>" in page


def test_every_table_kind_has_its_own_caption():
    assert table_caption("fedst", "table2_synthetic").startswith("FedST paper Table II")
    assert table_caption("earlystop", "table2").startswith("Early-stopping paper Table 2")
    assert table_caption("ultraflwr", "table1_params").startswith("UltraFlwr Table I")
    assert "breastmnist" in table_caption("gpaf", "table1_breastmnist_synthetic")
    assert "group combined" in table_caption("ultraflwr", "top_strategies_combined_synthetic")
    assert table_caption("fedst", "table7_synthetic") == "FedST paper Table 7 (Dice / IoU in %, or cost)."


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    pytest.skip("headless Chromium is not installed (make system-deps installs the Debian package 'chromium' as root)")


@pytest.mark.slow
def test_report_has_every_study_rendered_in_chromium(tmp_path):
    chromium = _chromium()
    work = copy_workflow(tmp_path / "wf")
    (work / "tiny.yaml").write_text(yaml.safe_dump(tiny_demo(DEMO)))
    run = lambda *a: subprocess.run([sys.executable, "-m", "snakemake", *a, "--configfile", "tiny.yaml"],  # noqa: E731
                                    cwd=work, capture_output=True, text=True, timeout=1500)
    proc = run("--cores", "2")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # every finished training job of every study (the UltraFlwr strategies and centralized baseline included)
    # keeps its results, not its resume state or working files
    runs = [p.parent for p in (work / "results").rglob("summary.json")]
    assert {r.relative_to(work / "results").parts[0] for r in runs} >= set(STUDIES)
    left = [p for r in runs for p in r.iterdir() if p.name in ("work", "checkpoint") or p.name.startswith(".")]
    assert left == []
    proc = run("--cores", "1", "--report", "report.zip")
    assert proc.returncode == 0, proc.stderr[-3000:]
    with zipfile.ZipFile(work / "report.zip") as z:
        names = [n.rsplit("/", 1)[-1] for n in z.namelist()]
        z.extractall(tmp_path / "report")
    # every study's tables as formatted pages (no raw CSV), its figures, partitions and data statistics
    tables = ["final_metrics_synthetic.html", "table1_synthetic.html", "table2_synthetic.html",
              "table1_breastmnist_synthetic.html", "convergence_rounds_synthetic.html", "table1_params.html",
              "top_strategies_combined_synthetic.html", "communication_synthetic.html",
              *[f"table{i}_synthetic.html" for i in range(2, 10)]]
    figures = ["convergence_synthetic.png", "fig3_stopping_synthetic.png", "fig4_tau_synthetic.png",
               "gpaf_convergence_synthetic.png", "tsne_breastmnist_alpha0.5_synthetic.png",
               "figure3_combined_synthetic.png", "distribution_synthetic.png", "seed0.png"]
    for name in tables + figures:
        assert name in names, name
    assert names.count("final_metrics_synthetic.html") == 3  # quickstart, earlystop, gpaf
    assert not any(n.endswith(".csv") for n in names)
    index = tmp_path / "report" / "report" / "report.html"
    dom = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=20000",
                          "--dump-dom", index.as_uri()], capture_output=True, text=True, timeout=180).stdout
    for section in (*STUDIES, "data"):  # the rendered menu: one entry per study (report category)
        assert f"<span>{section}</span></a>" in dom, f"section '{section}' missing from the rendered report"
