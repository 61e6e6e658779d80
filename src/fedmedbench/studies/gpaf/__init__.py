"""The GPAF study (docs/gpaf.md): its report targets, Table 1, convergence, t-SNE and domain figures."""
