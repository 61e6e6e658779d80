"""Federated learning, in rooms by job: ``api/`` is what a method file imports (the ``Method`` base class, its
``Param`` declarations, model arrays, the registry); ``engine/`` runs one job's federation (the only Flower
user); ``state/`` makes a run resumable bit for bit; ``methods/`` holds one file per registered method and
``tasks/`` one task per kind of data. The modules beside them are the pieces every method and task shares:
the run's spec, the clients' data and training batches, the local training loops, early stopping, tracking
and determinism. Importing the package loads nothing else."""
