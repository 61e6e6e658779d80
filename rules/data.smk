# Data: official MedMNIST files (download or a verified local folder), the user's own datasets
# (checked on import), the synthetic stand-in for the demo, and the client imaging domains (acquisition profiles, medmnistc corruptions).


# No params: where a file comes from and how hard to try (data.medmnist_root, data.download) do not
# change its verified bytes, so changing them must not rerun (and delete) a verified file; the
# script reads them from the config.
rule download_medmnist:
    output:
        "resources/medmnist/{dataset}_{size}.npz",
    log:
        "logs/download_medmnist/{dataset}_{size}.log",
    benchmark:
        "benchmarks/download_medmnist/{dataset}_{size}.tsv"
    threads: 1
    resources:
        mem_mb=500,
        runtime=60,
    conda:
        SOFTWARE_ENV
    script:
        "../scripts/download_medmnist.py"


# The imported copy is tied to its source by `source` (path and content hash); its own SHA-256 is recorded
# beside it (record) and checked wherever it is loaded.
rule import_user_dataset:
    input:
        user_source_file,
    output:
        npz="resources/user/{dataset}_{size}.npz",
        record="resources/user/{dataset}_{size}.import.json",
    params:
        entry=user_dataset,
        source=user_source,
    log:
        "logs/import_user_dataset/{dataset}_{size}.log",
    benchmark:
        "benchmarks/import_user_dataset/{dataset}_{size}.tsv"
    threads: 1
    resources:
        mem_mb=config["resources"]["data_mem_mb"],
        runtime=30,
    conda:
        SOFTWARE_ENV
    script:
        "../scripts/import_user_dataset.py"


rule synthesize_medmnist:
    output:
        "resources/synthetic/{dataset}_{size}.npz",
    params:
        synthetic=synthetic_params,
    log:
        "logs/synthesize_medmnist/{dataset}_{size}.log",
    benchmark:
        "benchmarks/synthesize_medmnist/{dataset}_{size}.tsv"
    threads: 1
    resources:
        mem_mb=config["resources"]["data_mem_mb"],
        runtime=30,
    conda:
        SOFTWARE_ENV
    script:
        "../scripts/synthesize_medmnist.py"


rule verify_medmnist:
    input:
        "resources/medmnist/{dataset}_{size}.npz",
    output:
        "resources/medmnist/{dataset}_{size}.npz.verified",
    log:
        "logs/verify_medmnist/{dataset}_{size}.log",
    benchmark:
        "benchmarks/verify_medmnist/{dataset}_{size}.tsv"
    threads: 1
    resources:
        mem_mb=500,
        runtime=30,
    conda:
        SOFTWARE_ENV
    script:
        "../scripts/verify_medmnist.py"


rule corrupt_medmnist:
    input:
        corrupt_input,
        verified=corrupt_verified,
    output:
        "resources/domains/{origin}/{dataset}_{size}/{domain}.npz",
    params:
        steps=domain_steps,
        seed=config["domain_seed"],
    log:
        "logs/corrupt_medmnist/{origin}/{dataset}_{size}/{domain}.log",
    benchmark:
        "benchmarks/corrupt_medmnist/{origin}/{dataset}_{size}/{domain}.tsv"
    threads: 1
    resources:
        mem_mb=config["resources"]["data_mem_mb"],
        runtime=120,
    conda:
        SOFTWARE_ENV
    script:
        "../scripts/corrupt_medmnist.py"
