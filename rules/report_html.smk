# The HTML report (`snakemake --report`): every study's tables as formatted pages (rounded as the
# papers print them; the CSVs keep full precision), its figures, partition heatmaps and data
# statistics, grouped by study (report category) with a short caption each.


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
