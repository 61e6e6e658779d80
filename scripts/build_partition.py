"""Snakemake entry: client partition JSON + per-client label-count CSV + heatmap PNG."""
import _srcpath  # noqa: F401,I001  (puts src/ on sys.path)
from fedmedbench.workflow import io
from fedmedbench.partition import schemes as partition
from fedmedbench.data import medmnist, user
from fedmedbench.report import figures
from fedmedbench.workflow.runlog import log_to

with log_to(snakemake.log[0]) as log:
    w, p = snakemake.wildcards, snakemake.params
    n_classes = user.info(w.dataset, p.user_dataset).n_classes
    data = medmnist.load_npz(snakemake.input[0], num_classes=n_classes)
    medmnist.require_nonempty(snakemake.input[0], data)  # before any training, not a table of n/a after it
    labels = {s: data[f"{s}_labels"] for s in medmnist.SPLITS}
    doc = partition.build_partition(labels, p.scheme, p.num_clients, int(w.seed), dict(p.scheme_params),
                                    num_classes=n_classes, draws=p.random_draws)
    stats = partition.stats_frame(doc, labels)
    io.write_json(snakemake.output.json, doc)
    io.write_csv(snakemake.output.stats, stats)
    io.save_figure(snakemake.output.heatmap, figures.partition_heatmap(stats, f"{w.dataset} {w.setting} seed {w.seed}"))
    log(f"{p.scheme} partition: train sizes {[len(c['train']) for c in doc['clients']]}")
    if (warning := partition.holdout_warning(doc)) is not None:
        log.console(f"warning: {w.dataset} {w.setting} seed {w.seed}: {warning}")
