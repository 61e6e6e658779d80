# Glue from the rules to fedmedbench.studies.grid: the checks of a study's grid overrides, and which runs are
# shown from another setting and where each trains (rules/shared_runs.smk).
import re


def _check_grid_config():
    for sname, study in config["studies"].items():
        GRID.check_config(sname, study)


_check_grid_config()


def _shown_run_dirs():
    """results/<study>/<dataset>/<setting>/<method>/seed<k> of every shown run -> its home run folder."""
    out = {}
    for study, st in config["studies"].items():
        for (dataset, setting, method), home in GRID.shared_runs(st).items():
            for seed in st["seeds"]:
                shown = dict(study=study, dataset=dataset, setting=setting, method=method, seed=seed)
                out[run_dir(shown)] = run_dir({**shown, "setting": home})
    return out


SHOWN_RUNS = _shown_run_dirs()
#: matches exactly the shown runs' folders (nothing when there are none)
SHOWN_RUN_PATTERN = "|".join(re.escape(d[len("results/"):]) for d in sorted(SHOWN_RUNS)) or "(?!)"


def shown_run_home(wildcards):
    home = SHOWN_RUNS[f"results/{wildcards.shown_run}"]
    return {name.replace(".", "_"): f"{home}/{name}" for name in GRID.RUN_FILES}


def shown_run_setting(wildcards):
    """The setting a shown run is listed under (its folder's third part)."""
    return wildcards.shown_run.split("/")[2]

