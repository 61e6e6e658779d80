# The HTML report (`snakemake --report`): a first page with every study's data origin and main table,
# then every study's tables as formatted pages (rounded as printed; the CSVs keep full precision),
# its figures, partition heatmaps and data statistics, grouped by study (report category).


rule report_table_html:
    input:
        "results/{study}/tables/{table}.md",
    output:
        report(
            "results/{study}/report/{table}.html",
            caption="../report/study_table.rst",
            category="{study}",
            subcategory="tables",
        ),
    params:
        caption=html_caption,
        rounding=html_rounding,
        origin=of_study(report_origin),
    wildcard_constraints:
        table="[A-Za-z0-9][A-Za-z0-9_.-]*",
    log:
        "logs/report_table_html/{study}/{table}.log",
    threads: 1
    resources:
        mem_mb=500,
        runtime=5,
    conda:
        SOFTWARE_ENV
    script:
        "../scripts/report_table_html.py"


rule report_landing:
    input:
        report_main_tables,
    output:
        report(REPORT_LANDING, caption="../report/landing.rst", category="Main tables"),
    params:
        studies=report_studies(),
        data_category=bool(SURGICAL["groups"]),
    log:
        "logs/report_landing/landing.log",
    threads: 1
    resources:
        mem_mb=500,
        runtime=5,
    conda:
        SOFTWARE_ENV
    script:
        "../scripts/report_landing.py"
