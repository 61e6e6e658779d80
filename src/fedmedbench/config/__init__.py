"""Reading and checking configuration before anything runs: config files read strictly (``check``: duplicate
keys, alias bombs, non-finite numbers, the one-line config error) and the ``--configfile`` files of a
``snakemake`` command line checked before Snakemake reads them (``cmdline``)."""
