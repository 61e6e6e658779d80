# Config validation (schema with defaults + cross-field checks) and the helpers every study shares: they
# turn the config into file names, targets and per-run parameters. A study's own helpers are in
# rules/<study>_common.smk (earlystop, gpaf, ultraflwr, fedst), the surgical data layer's in surgical_common.smk.
import os
import sys
from pathlib import Path

import fedmedbench.data.domains as DOMAINS
import fedmedbench.data.medmnist as MEDMNIST
import fedmedbench.data.synthetic as SYNTHETIC
import fedmedbench.data.user as USER
import fedmedbench.studies.grid as GRID
import fedmedbench.partition.schemes as PARTITION
import fedmedbench.partition.replay as REPLAY
from fedmedbench.config.check import PERIODIC_REPEATS, coerce_numbers, config_error, ignored_settings, periodic_name, refuse_non_finite
from fedmedbench.data.medmnist import SIZES
from fedmedbench.data.medmnist import SUPPORTED_FLAGS as OFFICIAL_FLAGS
from fedmedbench.workflow.diagnostics import validate_config
from fedmedbench.report.html import table_caption, table_rounding
import fedmedbench.report.landing as LANDING
from fedmedbench.fl.api import method_params

SOFTWARE_ENV = "../envs/environment.yaml"

#: every method a config may name (built-in, installed, the config's own ``methods``) with its declared parameters
METHOD_SOURCES = method_params.sources(config)
#: config/schema.yaml, or a copy that also holds the config's own methods
SCHEMA = method_params.schema_for(config, Path(workflow.basedir) / "config" / "schema.yaml", METHOD_SOURCES,
                                  Path(".snakemake") / "fedmedbench")
# YAML 1.1 reads 5e-2 as text: numbers where the schema asks for one
coerce_numbers(config, SCHEMA)
# .nan and .inf pass every range check of the schema
refuse_non_finite(config)
method_params.check(config, METHOD_SOURCES)  # names and parameters against the methods' declarations, by key
validate_config(config, SCHEMA)
for _warning in ignored_settings(config):
    print(f"config warning: {_warning}", file=sys.stderr)

ORIGIN = config["data"]["origin"]
#: the user's own datasets (name -> registry entry); every other dataset name is an official MedMNIST flag
USER_DATASETS = config["datasets"]
#: file-name tag that marks outputs computed from synthetic data
TAG = "_synthetic" if ORIGIN == "synthetic" else ""
ID = "[A-Za-z0-9][A-Za-z0-9_.-]*"
#: a training job's GPU memory when its config declares none: more than any card, so Snakemake caps it at the
#: profile's ``--resources gpu_mem_mb`` and the job has the GPU to itself
WHOLE_GPU_MB = 10_000_000


def gpu_mem_mb(declared):
    """A training rule's ``gpu_mem_mb`` resource: what one job holds on the GPU (``declared``, MB, from the
    config's resources; None = the whole GPU), 0 on the CPU."""
    if config["device"] != "cuda":
        return 0
    return declared if declared is not None else WHOLE_GPU_MB


wildcard_constraints:
    study=ID,
    dataset="[a-z][a-z0-9-]*",
    setting=ID,
    method="[a-z_0-9]+",
    seed=r"\d+",
    size="|".join(map(str, SIZES)),
    origin="synthetic|real|user",
    domain=ID,
    sdataset=ID,
    sgroup=ID,


def _config_error(key, message):
    """One line naming the config file and key, then exit (also from input functions, after parsing)."""
    with exit_on_config_error(CONFIG_FILES):
        config_error(key, message)


def _check_registry():
    for name, entry in USER_DATASETS.items():
        if name in OFFICIAL_FLAGS:
            _config_error(f"datasets.{name}", "is an official MedMNIST flag; give your dataset another name")
        USER.check_registry_entry(name, entry)


def _check_datasets(sname, study):
    for ds in study["datasets"]:
        if ds not in OFFICIAL_FLAGS and ds not in USER_DATASETS:
            _config_error(f"studies.{sname}.datasets", f"'{ds}' is neither an official MedMNIST flag {list(OFFICIAL_FLAGS)} "
                          f"nor registered under 'datasets' {sorted(USER_DATASETS)}")
        if ds in USER_DATASETS and study["size"] not in USER_DATASETS[ds]["sizes"]:
            _config_error(f"studies.{sname}.size", f"{study['size']} px is not one of the sizes of dataset '{ds}' "
                          f"(datasets.{ds}.sizes: {USER_DATASETS[ds]['sizes']})")


def client_augmentation(study, setting):
    """The setting's ``client_augmentation``, else the study's (none | reference | reference_train)."""
    return GRID.run_client_augmentation(config["studies"][study], setting)


def _check_names(sname, study):
    """Study and setting names become wildcard values: one Snakemake takes for a rule applied to its own output
    (a repeated ending) stops planning with its PeriodicWildcardError, so it is refused here naming the key."""
    for key, name in [(f"studies.{sname}", sname), *((f"studies.{sname}.settings.{s}", s) for s in study["settings"])]:
        if (piece := periodic_name(name)) is not None:
            _config_error(key, f"the name ends in '{piece}' repeated {PERIODIC_REPEATS} times or more, which Snakemake "
                          "refuses in a file name (PeriodicWildcardError); choose another name")


def _check_config():
    _check_registry()
    for sname, study in config["studies"].items():
        _check_names(sname, study)
        _check_datasets(sname, study)
        for setname, setting in study["settings"].items():
            key = f"studies.{sname}.settings.{setname}"
            scheme, params = setting["scheme"], setting["params"]
            for ds in setting.get("datasets", []):
                if ds not in study["datasets"]:
                    _config_error(f"{key}.datasets", f"'{ds}' is not one of the study's datasets {study['datasets']}")
            if scheme == "domain":
                domains = params.get("domains") or _config_error(f"{key}.params.domains", "the domain scheme needs a list of domain names")
                for d in domains:
                    if d not in config["domains"]:
                        _config_error(f"{key}.params.domains", f"unknown domain '{d}'; defined under 'domains': {sorted(config['domains'])}")
                if setting["num_clients"] != len(domains):
                    _config_error(f"{key}.num_clients", f"must equal the number of domains ({len(domains)})")
                if client_augmentation(sname, setname) != "none":
                    for d in domains:
                        try:
                            DOMAINS.device_of(config["domains"][d], d, config["domain_seed"])
                        except DOMAINS.DomainSpecError as e:
                            _config_error(f"{key}.client_augmentation", str(e))
            if scheme == "center" and setting["num_clients"] != 2:
                _config_error(f"{key}.num_clients", "the center scheme has exactly 2 clients")
            cpr = study["clients_per_round"]
            if cpr is not None and cpr > setting["num_clients"]:
                _config_error(f"studies.{sname}.clients_per_round", f"{cpr} exceeds num_clients={setting['num_clients']} of setting '{setname}'")
            if study["random_draws"] != "project" and (why := REPLAY.check_setting(scheme, params)):
                _config_error(f"{key}.scheme", f"random_draws: {study['random_draws']}: {why}")


_check_config()


def known_split_counts(dataset):
    """Samples per split where planning knows them (official and synthetic files); None for a user dataset."""
    if dataset in USER_DATASETS:
        return None
    if ORIGIN == "synthetic":
        syn = synthetic_settings(dataset)
        return SYNTHETIC.default_counts(dataset, {s: syn[f"max_{s}"] for s in ("train", "val", "test")})
    return dict(MEDMNIST.dataset_info(dataset).n_samples)


def _warn_holdout_shortfall():
    """More clients than validation or test samples: some clients would have no local score (a warning)."""
    for sname, study in config["studies"].items():
        for setname, setting in study["settings"].items():
            if setting["scheme"] == "center":
                continue
            for ds in setting.get("datasets") or study["datasets"]:
                counts = known_split_counts(ds)
                short = PARTITION.holdout_shortfall(setting["num_clients"], counts) if counts else []
                if short:
                    print(f"config warning: studies.{sname}.settings.{setname}.num_clients = {setting['num_clients']} "
                          f"but {ds} has {' and '.join(short)}: some clients get no validation/test data, have no "
                          "local score, and local_mean_* averages the others", file=sys.stderr)


def study_size(study):
    return config["studies"][study]["size"]


def user_dataset(wildcards):
    """The registry entry of the job's user dataset; None for an official flag."""
    return USER_DATASETS.get(wildcards.dataset)


def user_source_file(wildcards):
    with exit_on_config_error(CONFIG_FILES):  # a missing source: one line naming the config file and key
        return str(USER.existing_source(wildcards.dataset, USER_DATASETS[wildcards.dataset], int(wildcards.size)))


def user_source(wildcards):
    """The source's resolved path and SHA-256: a moved or changed source is imported again, a missing one
    stops planning naming it (mtime alone misses a file replaced by an older one)."""
    with exit_on_config_error(CONFIG_FILES):
        return USER.source_fingerprint(wildcards.dataset, USER_DATASETS[wildcards.dataset], int(wildcards.size),
                                       "resources/user")


def dataset_origin(dataset, size):
    """Where a dataset's data come from, as tables and captions say it."""
    if dataset in USER_DATASETS:
        return USER.origin_label(USER_DATASETS[dataset], size)
    return ORIGIN


def study_origin(study):
    """The study's data origin for captions: synthetic, real, and/or 'user data: <path>' (joined by '; ')."""
    size = study_size(study)
    names = sorted({r["dataset"] for r in runs(study)})
    parts = [ORIGIN] if any(n not in USER_DATASETS for n in names) else []
    parts += [dataset_origin(n, size) for n in names if n in USER_DATASETS]
    return "; ".join(parts)


def study_train_overrides(study):
    """setting -> method -> the train keys where the pair's runs differ from the study's train, [run, study]
    (the final-metrics tables' notes)."""
    return GRID.train_overrides(config["studies"][study])


def synthetic_settings(dataset):
    """The generator's settings for one flag: data.synthetic with that flag's per_dataset overrides."""
    syn = {k: v for k, v in config["data"]["synthetic"].items() if k != "per_dataset"}
    return {**syn, **config["data"]["synthetic"]["per_dataset"].get(dataset, {})}


def synthetic_params(wildcards):
    """The generator's settings for the job's flag."""
    return synthetic_settings(wildcards.dataset)


_warn_holdout_shortfall()


def base_npz(dataset, size):
    if dataset in USER_DATASETS:
        return f"resources/user/{dataset}_{size}.npz"
    if ORIGIN == "synthetic":
        return f"resources/synthetic/{dataset}_{size}.npz"
    return f"resources/medmnist/{dataset}_{size}.npz"


def verified_marker(dataset, size):
    """Real data: the marker written once the official file's MD5 was checked (rule verify_medmnist),
    however the file got into resources/medmnist/. Every reader depends on it; synthetic and user data have none."""
    if ORIGIN == "synthetic" or dataset in USER_DATASETS:
        return []
    return [f"resources/medmnist/{dataset}_{size}.npz.verified"]


def domain_npz(dataset, size, domain):
    """A domain with no corruption steps is the base file itself (no copy)."""
    if not config["domains"][domain]:
        return base_npz(dataset, size)
    origin = "user" if dataset in USER_DATASETS else ORIGIN
    return f"resources/domains/{origin}/{dataset}_{size}/{domain}.npz"


def domain_steps(wildcards):
    """The corruption steps of the job's domain (``domains.<name>``)."""
    return config["domains"][wildcards.domain]


def domain_sources(study, dataset, setting):
    """Domain name -> npz path for a ``domain`` setting (its clients' data)."""
    s = config["studies"][study]["settings"][setting]
    return {d: domain_npz(dataset, study_size(study), d) for d in s["params"]["domains"]}


def setting_sources(study, dataset, setting):
    """Data source name -> npz path for a setting (``base`` and/or one per domain; ``partition.source_names``).

    A ``domain`` setting with ``holdout: official`` (the default) also reads ``base``: its global
    test set is the official test split without domain shift."""
    s = config["studies"][study]["settings"][setting]
    size = study_size(study)
    return {name: base_npz(dataset, size) if name == "base" else domain_npz(dataset, size, name)
            for name in PARTITION.source_names(s["scheme"], s.get("params") or {})}


def augmentation_spec(study, setting):
    """What a run's clients need to read their batches as the GPAF authors' loader (fl/augment.py): the
    mode, the steps of the setting's domains and the domain seed; None when off."""
    mode = client_augmentation(study, setting)
    if mode == "none":
        return None
    names = (config["studies"][study]["settings"][setting].get("params") or {}).get("domains") or []
    return {"mode": mode, "domains": {d: config["domains"][d] for d in names}, "domain_seed": config["domain_seed"]}


def run_setting_sources(study, dataset, setting):
    """A run's data sources: its setting's, and the clean base file when its clients redraw the domain
    noise at each read (``client_augmentation``)."""
    sources = setting_sources(study, dataset, setting)
    if client_augmentation(study, setting) != "none":
        sources.setdefault("base", base_npz(dataset, study_size(study)))
    return sources


def run_sources(wildcards):
    """The npz files a run reads, each once (its setting's data sources)."""
    return sorted(set(run_setting_sources(wildcards.study, wildcards.dataset, wildcards.setting).values()))


def partition_sources(wildcards):
    """What a partition is drawn from: the base file at the study's size, and its MD5 marker for real data."""
    size = study_size(wildcards.study)
    return [base_npz(wildcards.dataset, size), *verified_marker(wildcards.dataset, size)]


def setting_datasets(study, setting):
    return GRID.setting_datasets(config["studies"][study], setting)


def runs(study):
    for r in GRID.runs(config["studies"][study]):
        yield dict(study=study, **r)


def run_dir(w):
    return f"results/{w['study']}/{w['dataset']}/{w['setting']}/{w['method']}/seed{w['seed']}"


def partition_json(w):
    return f"resources/partitions/{w['study']}/{w['dataset']}/{w['setting']}/seed{w['seed']}.json"


def early_stopping_spec(es):
    """Only what changes training: tau/patience matter to a run only when it stops itself."""
    if es["mode"] == "none":
        return {"mode": "none"}
    return {"mode": es["mode"], "tau": es["tau"], "patience": es["patience"], "counting": es["counting"]}


def run_spec(wildcards):
    """The resolved per-run parameters (a fedmedbench RunSpec as a dict, result-changing fields only:
    threads and log_every come from the job and config, see fedmedbench.fl.spec.for_job)."""
    w = dict(wildcards)
    st = config["studies"][w["study"]]
    return {
        "run_dir": run_dir(w),
        "study": w["study"],
        "dataset": w["dataset"],
        "setting": w["setting"],
        "method": w["method"],
        "seed": int(w["seed"]),
        "partition_path": partition_json(w),
        "sources": run_setting_sources(w["study"], w["dataset"], w["setting"]),
        "image_size": st["size"],
        "model": run_model(w["study"], w["method"])["name"],
        "pretrained_path": run_weights(w["study"], w["method"])[0],
        "train": GRID.run_train(st, w["setting"], w["method"]),
        "clients_per_round": st["clients_per_round"],
        "method_params": method_params.resolve(w["method"], st["method_params"], st["settings"][w["setting"]]),
        **method_params.run_fields(w["method"], METHOD_SOURCES, config),
        "device": config["device"],
        "data_origin": dataset_origin(w["dataset"], st["size"]),
        "eval_every": st["eval_every"],
        "early_stopping": early_stopping_spec(st["early_stopping"]),
        "save_client_models": st["save_client_models"],
        "client_models_round": st["client_models_round"],
        # only when on: other studies' params (and run hashes) stay as they were
        **({"client_validation": st["client_validation"]} if st["client_validation"] else {}),
        **({"random_draws": st["random_draws"]} if st["random_draws"] != "project" else {}),
        **({"client_augmentation": aug} if (aug := augmentation_spec(w["study"], w["setting"])) else {}),
    }


def run_model(study, method):
    """The model block of one method: the study's, with the method's override (method_model) on top."""
    return GRID.run_model(config["studies"][study], method)


def run_weights(study, method):
    """(weight file, manifests) of a method's model block (rules/weights.smk)."""
    key = f"studies.{study}.method_model.{method}" if method in config["studies"][study]["method_model"] else f"studies.{study}.model"
    return model_weights(run_model(study, method), key)


# ----- train.seeds_together: a study's seeds of one job side by side (rules/train.smk)


def seeds_together_studies():
    """The studies whose seeds of one dataset, setting and method train in one job (``train.seeds_together``)."""
    return [s for s, st in config["studies"].items() if st["train"].get("seeds_together")]


def each_seed(study, of):
    """An input function giving ``of`` for every seed of ``study`` (its wildcards plus the seed)."""
    seeds = config["studies"][study]["seeds"]

    def per_seed(wildcards):
        return [of({**dict(wildcards), "seed": seed}) for seed in seeds]

    return per_seed


def seed_specs(study):
    """A params function: the run spec of every seed of ``study`` by its run folder's name (``seed<k>``), so a
    rerun's reason names the run and key that changed (``seed0.train.lr 0.05 -> 0.1``)."""
    seeds = config["studies"][study]["seeds"]

    def specs(wildcards):
        return {f"seed{seed}": run_spec({**dict(wildcards), "seed": seed}) for seed in seeds}

    return specs


def seed_outputs(study, name):
    """One output file ``name`` per seed of ``study``, in each seed's run folder (as train_federated writes it)."""
    return [f"results/{{study}}/{{dataset}}/{{setting}}/{{method}}/seed{seed}/{name}" for seed in config["studies"][study]["seeds"]]


def together_gpu_mem_mb(n_seeds):
    """The GPU memory of ``n_seeds`` runs in one process: each run's declared figure, or the whole GPU."""
    declared = config["resources"]["train_gpu_mem_mb"]
    return None if declared is None else declared * n_seeds


def run_weight_manifests(wildcards):
    """The weight-set manifests a run depends on (none without a named set)."""
    return run_weights(wildcards.study, wildcards.method)[1]


def run_verified(wildcards):
    """The MD5 marker of a run's real MedMNIST file (none for synthetic and user data)."""
    return verified_marker(wildcards.dataset, study_size(wildcards.study))


def study_summaries(wildcards):
    return [f"{run_dir(r)}/summary.json" for r in runs(wildcards.study)]


def study_metrics(wildcards):
    return [f"{run_dir(r)}/metrics.csv" for r in runs(wildcards.study)]


# --- input and params functions by the job's study (named, so rule bodies hold no lambdas) -----
def study_value(*keys):
    """Params function: the job's study block at ``keys`` (``study_value("early_stopping", "tau")``)."""
    def value(wildcards):
        node = config["studies"][wildcards.study]
        for key in keys:
            node = node[key]
        return node
    value.__name__ = "_".join(("study", *keys))
    return value


def setting_value(key):
    """Params function: one key of the job's setting block (``studies.<study>.settings.<setting>``)."""
    def value(wildcards):
        return config["studies"][wildcards.study]["settings"][wildcards.setting][key]
    value.__name__ = f"setting_{key}"
    return value


def of_study(fn):
    """Input or params function: ``fn`` of the job's study name (``of_study(study_origin)``)."""
    def value(wildcards):
        return fn(wildcards.study)
    value.__name__ = f"{fn.__name__}_of_study"
    return value


def study_name(wildcards):
    return wildcards.study


def study_setting_names(wildcards):
    """The study's setting names, in config order (the order tables list them)."""
    return list(config["studies"][wildcards.study]["settings"])


def all_targets():
    out = []
    for study in config["studies"]:
        out += expand("results/{study}/tables/final_metrics{tag}.{ext}", study=study, tag=TAG, ext=["csv", "md", "tex"])
        out.append(f"results/{study}/figures/convergence{TAG}.png")
        out += earlystop_targets(study)
        out += gpaf_targets(study)
    return out


def corrupt_input(wildcards):
    """The base file a domain is corrupted from (by the origin wildcard)."""
    if wildcards.origin == "user":
        return f"resources/user/{wildcards.dataset}_{wildcards.size}.npz"
    if wildcards.origin == "synthetic":
        return f"resources/synthetic/{wildcards.dataset}_{wildcards.size}.npz"
    return f"resources/medmnist/{wildcards.dataset}_{wildcards.size}.npz"


def corrupt_verified(wildcards):
    """The MD5 marker of the base file a domain is corrupted from (real data only)."""
    return verified_marker(wildcards.dataset, wildcards.size) if wildcards.origin == "real" else []


def paper_values_input(study):
    """The study's typed-in paper values (config/paper_values/<study>.yaml), when there are any."""
    path = f"config/paper_values/{study}.yaml"
    return [path] if os.path.isfile(os.path.join(workflow.basedir, path)) else []


# --- HTML report (rules/report_html.smk) --------------------------------------------------------
#: the report's first page (rule report_landing; included by report/workflow.rst once built)
REPORT_LANDING = "results/report/landing.html"


def report_origin(study):
    """Data origin shown in a caption: MedMNIST studies by their datasets, surgical studies by surgical.origin."""
    return study_origin(study) if study in config["studies"] else SORIGIN


def study_paper(study):
    """The paper a study reproduces (a key of fedmedbench.report.landing.PAPERS), None for a study of one's own:
    a MedMNIST study by its paper outputs, the surgical studies (ultraflwr, fedst) by their name."""
    if study not in config["studies"]:
        return study
    s = config["studies"][study]
    if s["early_stopping"]["report"]:
        return "earlystop"
    if s["report"].get("gpaf") is not None:
        return "gpaf"
    return None


def html_caption(wildcards):
    return table_caption(wildcards.study, wildcards.table)


def html_rounding(wildcards):
    """How the job's table is rounded: as its paper prints it only where the study has a paper."""
    return table_rounding(wildcards.study, wildcards.table, study_paper(wildcards.study) is not None)


def _report_markdown_tables():
    """Every Markdown table that rule all builds."""
    out = []
    for t in [*all_targets(), *ultraflwr_targets(), *fedst_targets()]:
        p = Path(t)
        if p.suffix == ".md" and p.parent.name == "tables":
            out.append(t)
    return out


def report_html_targets():
    """One HTML page (results/<study>/report/<table>.html) per Markdown table that rule all builds, and the landing page."""
    out = [str(Path(t).parent.parent / "report" / f"{Path(t).stem}.html") for t in _report_markdown_tables()]
    return [*out, REPORT_LANDING]


def report_studies():
    """Every study of the run as the landing page lists it (fields of fedmedbench.report.landing.StudyEntry)."""
    tables = _report_markdown_tables()
    studies = [(s, sorted({r["dataset"] for r in runs(s)})) for s in config["studies"]]
    if ultraflwr_targets():
        studies.append(("ultraflwr", sorted({d for g in UF["groups"] for d in SURGICAL["groups"][g]["datasets"]})))
    if fedst_targets():
        studies.append(("fedst", sorted({site["dataset"] for site in SURGICAL["sites"].values()})))
    return [dict(name=s, paper=study_paper(s), datasets=datasets, origin=report_origin(s),
                 tables=[t for t in tables if t.startswith(f"results/{s}/tables/")]) for s, datasets in studies]


def report_main_tables(wildcards):
    """The Markdown tables the landing page shows: each study's main table."""
    return [t for s in report_studies() for t in LANDING.main_tables(LANDING.StudyEntry(**s))]
