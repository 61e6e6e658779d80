"""The FedST study (docs/fedst.md): its runs and variants, pre-training, deployed evaluation and report."""
