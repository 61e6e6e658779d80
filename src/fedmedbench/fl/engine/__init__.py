"""The engine: one job's federation run. ``job`` resolves a run's spec, method, task and device once;
``federation`` holds the round logic (sampling, aggregation, evaluation, checkpoints), transport-free;
``flower`` is the only Flower user (ServerApp and ClientApp, inline or Ray backend) and ``inline_grid`` its
in-process message grid; ``replies`` checks what a site sends before it is averaged; ``runs_together`` trains
several runs side by side in one process. Importing the package loads none of them."""
