# GPAF study report: glue from the rules (report_gpaf.smk) to fedmedbench.studies.gpaf.runs (checks, targets, t-SNE runs).
from functools import partial

import fedmedbench.studies.gpaf.runs as GPAF


def _check_gpaf_config():
    for sname, study in config["studies"].items():
        GPAF.check_config(sname, study)


_check_gpaf_config()


def gpaf_targets(study):
    return GPAF.targets(study, config["studies"][study], list(runs(study)), partial(setting_datasets, study), TAG)


def gpaf_dataset_summaries(wildcards):
    return [f"{run_dir(r)}/summary.json" for r in runs(wildcards.study) if r["dataset"] == wildcards.dataset]


def gpaf_dataset_metrics(wildcards):
    """Per-round metrics of the dataset's runs: Table 1's best-validation round (report.gpaf.table_eval)."""
    return [f"{run_dir(r)}/metrics.csv" for r in runs(wildcards.study) if r["dataset"] == wildcards.dataset]


def gpaf_domain_files(wildcards):
    """The npz file of each domain of the job's setting (Fig. 2 reads their images)."""
    return list(domain_sources(wildcards.study, wildcards.dataset, wildcards.setting).values())


def gpaf_domain_names(wildcards):
    return list(domain_sources(wildcards.study, wildcards.dataset, wildcards.setting))


def _gpaf_tsne_runs(wildcards):
    return GPAF.tsne_runs(wildcards.study, config["studies"][wildcards.study], wildcards.dataset, wildcards.setting)


def gpaf_tsne_inputs(wildcards):
    """Each shown method's first-seed run (its summary names client_models.pt), partition and data."""
    files = []
    for r in _gpaf_tsne_runs(wildcards):
        files += [f"{run_dir(r)}/summary.json", f"{run_dir(r)}/model.pt"]
    files.append(partition_json(_gpaf_tsne_runs(wildcards)[0]))
    files += run_sources(wildcards)
    return files


def gpaf_tsne_specs(wildcards):
    return {r["method"]: run_spec(r) for r in _gpaf_tsne_runs(wildcards)}
