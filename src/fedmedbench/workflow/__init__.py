"""What a Snakemake job uses at run time, whatever it computes: atomic file writes (``io``), the entry scripts'
logging and one console line on failure (``runlog``), one process per run (``runlock``), why a job reruns
(``rerun_reason``) and what a user sees when a config or a job is wrong (``diagnostics``)."""
