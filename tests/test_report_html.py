"""The HTML report (`snakemake --report`): every study's section, rendered in headless Chromium.

A shrunken copy of the demo config (every study kind: quickstart, earlystop, gpaf, ultraflwr,
fedst; one or two rounds, tiny data) runs through the workflow, the report is built, and Chromium
renders it (the report is a JavaScript page: the categories exist only after it runs).
"""

from __future__ import annotations

import copy
import html
import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml
from helpers import ROOT, copy_workflow

from fedmedbench.report.html import markdown_to_html, table_caption, table_rounding
from fedmedbench.report.landing import StudyEntry, landing_html, main_tables, origin_kinds

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
    # a wide table scrolls sideways inside its box instead of being cut at the window's edge
    assert '<div class="fmb-scroll"><table>' in page and ".fmb-scroll{overflow-x:auto" in page


def test_every_table_kind_has_its_own_caption():
    assert table_caption("fedst", "table2_synthetic").startswith("FedST paper Table II")
    assert table_caption("earlystop", "table2").startswith("Early-stopping paper Table 2")
    assert table_caption("ultraflwr", "table1_params").startswith("UltraFlwr Table I")
    assert "breastmnist" in table_caption("gpaf", "table1_breastmnist_synthetic")
    # the GPAF table's F1 is what report.gpaf.table_metrics names (weighted by default), not always macro F1
    assert "macro F1" not in table_caption("gpaf", "table1_breastmnist")
    assert "group combined" in table_caption("ultraflwr", "top_strategies_combined_synthetic")
    assert table_caption("fedst", "table7_synthetic") == "FedST paper Table 7 (Dice / IoU in %, or cost)."


def test_paper_rounding_is_claimed_only_for_a_papers_table():
    assert table_rounding("earlystop", "table1_synthetic", has_paper=True) == "Values rounded as the paper prints them"
    assert table_rounding("earlystop", "final_metrics_synthetic", has_paper=True) == "Values rounded to two decimals"
    assert table_rounding("mine", "final_metrics", has_paper=False) == "Values rounded to two decimals"
    assert table_rounding("mine", "table1", has_paper=False) == "Values rounded to two decimals"


USER_STUDY = StudyEntry(name="mine", paper=None, datasets=["digits"], origin="user data: /data/digits.npz",
                        tables=["results/mine/tables/final_metrics.md"])
FINAL_MD = "Study 'mine': final-round metrics.\n\n| method | global_accuracy |\n|:--|--:|\n| fedavg | 91.25 ± 0.50 |\n"


def test_landing_text_of_a_user_data_study_says_user_data_and_shows_its_table():
    page = landing_html([USER_STUDY], {"results/mine/tables/final_metrics.md": FINAL_MD}, data_category=False)
    assert "<b>mine</b>: a study of your own (no paper); data: digits, user data (/data/digits.npz)." in page
    assert "synthetic" not in page.lower() and "MedMNIST" not in page and "official" not in page
    assert "<b>data</b>" not in page  # no surgical data statistics in this report: no such category named
    assert "<h3>mine: final_metrics</h3>" in page and "<td>fedavg</td><td>91.25 ± 0.50</td>" in page


def test_landing_text_names_each_studys_paper_origin_and_main_table():
    es = StudyEntry(name="earlystop", paper="earlystop", datasets=["dermamnist"], origin="synthetic",
                    tables=[f"results/earlystop/tables/{t}_synthetic.md" for t in ("final_metrics", "table1", "table2")])
    gp = StudyEntry(name="g", paper="gpaf", datasets=["breastmnist", "mine"], origin="real; user data: m.npz",
                    tables=[f"results/g/tables/{t}.md" for t in ("final_metrics", "table1_breastmnist", "table1_mine",
                                                                  "convergence_rounds")])
    uf = StudyEntry(name="ultraflwr", paper="ultraflwr", datasets=["m2cai16"], origin="synthetic",
                    tables=[f"results/ultraflwr/tables/{t}.md" for t in ("table1_params", "top_strategies_combined_synthetic",
                                                                          "pair_matrix_combined_synthetic")])
    assert main_tables(es) == ["results/earlystop/tables/table1_synthetic.md"]
    assert main_tables(gp) == ["results/g/tables/table1_breastmnist.md", "results/g/tables/table1_mine.md"]
    assert main_tables(uf) == ["results/ultraflwr/tables/top_strategies_combined_synthetic.md"]
    assert origin_kinds("real; user data: m.npz") == ["official", "user"] and origin_kinds("synthetic") == ["synthetic"]
    page = landing_html([es, gp], {}, data_category=True)
    assert "<b>earlystop</b>: reproduces <i>Beyond Fixed Rounds" in page
    assert "<b>g</b>: reproduces <i>GPAF" in page and "official (" in page and "user data (m.npz)" in page
    assert "NOT a reproduction of any paper" in page and "The category <b>data</b>" in page


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
    for section in ("Main tables", *STUDIES, "data"):  # the rendered menu: the first page, one entry per study, data
        assert f"<span>{section}</span></a>" in dom, f"section '{section}' missing from the rendered report"
    # the landing text: every study with its data origin and main table
    for study in STUDIES:
        assert f"<b>{study}</b>: " in dom, study
    assert "<b>quickstart</b>: a study of your own (no paper)" in dom and "The category <b>data</b>" in dom
    for table in ("quickstart: final_metrics_synthetic", "earlystop: table1_synthetic", "gpaf: table1_breastmnist_synthetic",
                  "ultraflwr: top_strategies_combined_synthetic", "fedst: table2_synthetic"):
        assert f"<h3>{table}</h3>" in dom, table


@pytest.fixture(scope="module")
def user_report(tmp_path_factory):
    """A user-data config run to the end, then its report built by the README's command, ``make report CONFIG=``,
    in the run's folder (its ``.venv`` the test's interpreter, already installed)."""
    from test_user_dataset import DIGITS, pack_digits

    work = copy_workflow(tmp_path_factory.mktemp("user_report") / "wf")
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(ROOT / name, work / name)
    (work / ".venv").mkdir()
    (work / ".venv" / "bin").symlink_to(Path(sys.executable).parent)
    (work / ".venv" / ".installed-stamp").touch()
    pack_digits(work / "digits.npz")
    cfg = {"device": "cpu", "data": {"origin": "real"}, "threads": {"train": 1},
           "datasets": {"digits": {"path": "digits.npz", "labels": DIGITS, "task": "multi-class", "channels": 1}},
           "studies": {"mine": {"datasets": ["digits"], "seeds": [0], "methods": ["fedavg"],
                                "settings": {"iid": {"scheme": "iid", "num_clients": 2}}, "train": {"rounds": 1}}}}
    (work / "mine.yaml").write_text(yaml.safe_dump(cfg))
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "2", "--configfile", "mine.yaml"],
                          cwd=work, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    proc = subprocess.run(["make", "report", "CONFIG=mine.yaml"], cwd=work, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return work / "results" / "report.html"


@pytest.mark.slow
def test_report_landing_text_of_a_user_data_config(user_report):
    """A study on the user's own data: the first page says user data (its file), no paper, no synthetic or
    official data and no surgical 'data' category, and shows the study's final metrics."""
    page = user_report.read_text()
    desc = page.split("var workflow_desc = ", 1)[1].split("\n    var ", 1)[0]  # the landing text (a JSON string)
    assert "<b>mine</b>: a study of your own (no paper); data: digits, user data (digits.npz)." in desc
    assert "<h3>mine: final_metrics</h3>" in desc and "<td>digits</td><td>iid</td><td>fedavg</td>" in desc
    for wrong in ("synthetic", "MedMNIST data origin", "official", "<b>data</b>"):
        assert wrong not in desc, wrong
    # the table's caption claims no paper rounding for a study without a paper
    assert "Values rounded to two decimals" in page and "as the paper prints them" not in page


#: run in the rendered report: where the landing text and its table are, and the text as shown (pseudo-elements
#: included: the report's typography style draws backticks around <code> that no DOM text holds)
_LAYOUT_PROBE = """<script>
function fmbProbe() {
  var landing = document.querySelector('.fmb-landing');
  if (!landing || document.getElementById('fmb-probe')) return;
  var text = landing.closest('.prose') || landing, table = landing.querySelector('table');
  var box = table.parentElement.getBoundingClientRect(), shown = text.innerText;
  text.querySelectorAll('*').forEach(function (el) {
    shown += getComputedStyle(el, '::before').content + getComputedStyle(el, '::after').content;
  });
  var out = {width: window.innerWidth, text_top: text.getBoundingClientRect().top,
             table_shown: Math.min(table.getBoundingClientRect().width, box.width), shown: shown};
  var pre = document.createElement('pre'); pre.id = 'fmb-probe'; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
}
setTimeout(fmbProbe, 1000);
new MutationObserver(function () { setTimeout(fmbProbe, 1000); }).observe(document.body, {childList: true, subtree: true});
</script>"""


def rendered_layout(chromium: str, page: Path, width: int = 1200, height: int = 1600) -> dict:
    """The landing's layout as headless Chromium renders ``page`` in a window of ``width`` x ``height`` px."""
    probe = page.with_name("probe_" + page.name)
    head, _ = page.read_text().rsplit("</body>", 1)
    probe.write_text(head + _LAYOUT_PROBE + "</body></html>\n")
    dom = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=20000",
                          f"--window-size={width},{height}", "--dump-dom", probe.as_uri()],
                         capture_output=True, text=True, timeout=180).stdout
    found = re.search(r'<pre id="fmb-probe">(.*?)</pre>', dom, re.S)
    assert found, "the landing text was not rendered"
    return json.loads(html.unescape(found.group(1)))


@pytest.mark.slow
def test_report_landing_layout_in_chromium(user_report):
    """At 1200 x 1600 the landing text starts at the top (not centred below a blank band), its table spans most
    of the page (not a narrow column beside the rule graph), and no literal backtick is shown."""
    layout = rendered_layout(_chromium(), user_report)
    assert layout["text_top"] < 100, layout
    assert layout["table_shown"] > 0.6 * layout["width"], layout
    assert "results/<study>/tables/" in layout["shown"] and "`" not in layout["shown"], layout["shown"]
