# Surgical video data layer (rules/surgical.smk; docs/surgical_data.md): config checks, folders and the
# helpers that give its rules their inputs and params; the ultraflwr and fedst studies read its exports.
SURGICAL = config["surgical"]
SORIGIN = SURGICAL["origin"]
#: file-name tag of surgical figures built from synthetic data
STAG = "_synthetic" if SORIGIN == "synthetic" else ""
SURG = f"resources/surgical/{SORIGIN}"
SYNTH_RAW = "resources/surgical/synthetic/raw"


def surgical_used_datasets():
    """Datasets the groups and sites need (only these are indexed)."""
    used = []
    for g in SURGICAL["groups"].values():
        used += g["datasets"]
    used += [s["dataset"] for s in SURGICAL["sites"].values()]
    return sorted(set(used))


def _check_surgical_config():
    datasets, groups = SURGICAL["datasets"], SURGICAL["groups"]
    for name in surgical_used_datasets():
        if name not in datasets:
            _config_error("surgical.datasets", f"'{name}' is used by a group or site but not defined (defined: {sorted(datasets)})")
        if SORIGIN == "synthetic" and name not in SURGICAL["synthetic"]["datasets"]:
            _config_error("surgical.synthetic.datasets", f"no synthetic spec for '{name}' (surgical.origin is synthetic)")
    if SORIGIN == "real" and surgical_used_datasets() and not SURGICAL["root"]:
        _config_error("surgical.root", "surgical.origin is real: set the folder holding the licensed datasets (docs/surgical_data.md)")
    for gname, g in groups.items():
        key = f"surgical.groups.{gname}"
        n = g["num_clients"]
        for field in ("exclude_videos", "frame_step", "video_splits"):
            for d in g[field]:
                if d not in g["datasets"]:
                    _config_error(f"{key}.{field}", f"'{d}' is not one of the group's datasets {g['datasets']}")
        if g["eval_sources"] is not None:
            if len(g["eval_sources"]) != n:
                _config_error(f"{key}.eval_sources", f"needs one entry per client ({n})")
            for src in g["eval_sources"]:
                for d in src:
                    if d not in g["datasets"]:
                        _config_error(f"{key}.eval_sources", f"'{d}' is not one of the group's datasets {g['datasets']}")
        if g["pool_from"] is not None and g["settings"].get(g["pool_from"], {}).get("scheme") != "curation":
            _config_error(f"{key}.pool_from", f"'{g['pool_from']}' is not a curation setting of the group")
        for sname, s in g["settings"].items():
            skey = f"{key}.settings.{sname}"
            if s["scheme"] == "curation" and len(s.get("sources") or g["eval_sources"] or []) != n:
                _config_error(f"{skey}.sources", f"curation needs one list of datasets per client ({n}) in sources or eval_sources")
            if s["scheme"] == "lmo":
                base = g["settings"].get(s["base"])
                if base is None or base["scheme"] == "lmo":
                    _config_error(f"{skey}.base", f"'{s['base']}' must be a non-lmo setting of the group")
                if len(s["client_classes"]) != n:
                    _config_error(f"{skey}.client_classes", f"needs one entry per client ({n})")
                for item in s["client_classes"]:
                    if isinstance(item, str) and item != "all" and item not in SURGICAL["tool_groups"]:
                        _config_error(f"{skey}.client_classes", f"'{item}' is neither 'all' nor a surgical.tool_groups name {sorted(SURGICAL['tool_groups'])}")


_check_surgical_config()


def surgical_dataset_cfg(wildcards):
    """The job's dataset config with its bad-file policy resolved (per-dataset override, else surgical.bad_files)."""
    cfg = dict(SURGICAL["datasets"][wildcards.sdataset])
    cfg["bad_files"] = cfg.get("bad_files") or SURGICAL["bad_files"]
    return cfg


def surgical_root():
    return SYNTH_RAW if SORIGIN == "synthetic" else SURGICAL["root"]


def surgical_raw_input(wildcards):
    """Synthetic: the generated folder. Real: none (the index script names a missing folder)."""
    if SORIGIN == "synthetic":
        return f"{SYNTH_RAW}/{SURGICAL['datasets'][wildcards.sdataset]['folder']}"
    return []


def surgical_synthetic_outputs():
    """The folders synthesize_surgical writes: one per synthetic dataset, in its release layout."""
    names = sorted(SURGICAL["synthetic"]["datasets"])
    return [directory(f"{SYNTH_RAW}/{SURGICAL['datasets'][n]['folder']}") for n in names if n in SURGICAL["datasets"]]


def surgical_synthetic_params():
    names = sorted(SURGICAL["synthetic"]["datasets"])
    return {"synthetic": SURGICAL["synthetic"], "datasets": {n: SURGICAL["datasets"][n] for n in names if n in SURGICAL["datasets"]}}


def surgical_index(name):
    return f"{SURG}/index/{name}"


def surgical_group(wildcards):
    """The job's group block (``surgical.groups.<sgroup>``)."""
    return SURGICAL["groups"][wildcards.sgroup]


def surgical_group_indices(wildcards):
    return {d: surgical_index(d) for d in SURGICAL["groups"][wildcards.sgroup]["datasets"]}


def surgical_site_releases():
    """Each site dataset's release key (facts.release_key: what its FedST Table I counts are listed under)."""
    from fedmedbench.data.surgical.facts import release_key

    return {d: release_key(SURGICAL["datasets"][d]) for d in sorted({s["dataset"] for s in SURGICAL["sites"].values()})}


def surgical_site_indices():
    return {d: surgical_index(d) for d in sorted({s["dataset"] for s in SURGICAL["sites"].values()})}


def surgical_targets():
    """Every surgical output the config asks for (added to rule all)."""
    out = []
    for g in SURGICAL["groups"]:
        out += [f"{SURG}/groups/{g}", f"{SURG}/yolo/{g}"]
    if SURGICAL["sites"]:
        out.append(f"{SURG}/clips")
    return out
