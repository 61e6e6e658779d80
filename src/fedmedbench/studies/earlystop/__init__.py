"""The early-stopping study (docs/earlystop.md): its report targets and Tables 1-2 / Figs. 3-4."""
