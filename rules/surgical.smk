# Surgical video data layer: synthetic videos in the real release layouts (demo), one frame
# index per dataset, video-level re-curation into the UltraFlwr client settings, and the
# exports the ultraflwr (YOLO per client) and fedst (clips per site) studies read.
# Details and the expected layouts of the licensed datasets: docs/surgical_data.md.
include: "surgical_common.smk"


rule synthesize_surgical:
    output:
        marker=f"{SYNTH_RAW}/SYNTHETIC.json",
        folders=surgical_synthetic_outputs(),
    params:
        spec=surgical_synthetic_params(),
    log:
        "logs/synthesize_surgical.log",
    benchmark:
        "benchmarks/synthesize_surgical.tsv"
    threads: 1
    resources:
        mem_mb=SURGICAL["mem_mb"],
        runtime=20,
    conda:
        SOFTWARE_ENV
    script:
        "../scripts/synthesize_surgical.py"


rule index_surgical:
    input:
        surgical_raw_input,
    output:
        directory(f"{SURG}/index/{{sdataset}}"),
    params:
        dataset=surgical_dataset_cfg,
        root=surgical_root(),
        origin=SORIGIN,
    log:
        f"logs/index_surgical/{SORIGIN}/{{sdataset}}.log",
    benchmark:
        f"benchmarks/index_surgical/{SORIGIN}/{{sdataset}}.tsv"
    threads: 1
    resources:
        mem_mb=SURGICAL["mem_mb"],
        runtime=120,
    conda:
        SOFTWARE_ENV
    script:
        "../scripts/index_surgical.py"


rule recurate_videos:
    input:
        unpack(surgical_group_indices),
    output:
        report(
            directory(f"{SURG}/groups/{{sgroup}}"),
            patterns=[f"{{setting}}/distribution{STAG}.png"],
            caption="../report/surgical_distribution.rst",
            category="data",
            subcategory="{sgroup}",
        ),
    params:
        group=surgical_group,
        tool_groups=SURGICAL["tool_groups"],
        origin=SORIGIN,
    log:
        f"logs/recurate_videos/{SORIGIN}/{{sgroup}}.log",
    benchmark:
        f"benchmarks/recurate_videos/{SORIGIN}/{{sgroup}}.tsv"
    threads: 1
    resources:
        mem_mb=SURGICAL["mem_mb"],
        runtime=30,
    conda:
        SOFTWARE_ENV
    script:
        "../scripts/recurate_videos.py"


rule export_yolo:
    input:
        f"{SURG}/groups/{{sgroup}}",
    output:
        directory(f"{SURG}/yolo/{{sgroup}}"),
    log:
        f"logs/export_yolo/{SORIGIN}/{{sgroup}}.log",
    benchmark:
        f"benchmarks/export_yolo/{SORIGIN}/{{sgroup}}.tsv"
    threads: 1
    resources:
        mem_mb=SURGICAL["mem_mb"],
        runtime=30,
    conda:
        SOFTWARE_ENV
    script:
        "../scripts/export_yolo.py"


rule export_clips:
    input:
        **surgical_site_indices(),
    output:
        directory(f"{SURG}/clips"),
    params:
        sites=SURGICAL["sites"],
        releases=surgical_site_releases(),
        clips=SURGICAL["clips"],
        origin=SORIGIN,
    log:
        f"logs/export_clips/{SORIGIN}.log",
    benchmark:
        f"benchmarks/export_clips/{SORIGIN}.tsv"
    threads: 1
    resources:
        mem_mb=SURGICAL["mem_mb"],
        runtime=30,
    conda:
        SOFTWARE_ENV
    script:
        "../scripts/export_clips.py"
