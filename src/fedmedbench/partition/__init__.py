"""Client partitions of a MedMNIST-format dataset: the schemes, one function each, with their files and checks
(``schemes``), and the early-stopping authors' NumPy draws replayed call for call (``replay``)."""
