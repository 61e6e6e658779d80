"""The UltraFlwr study (docs/ultraflwr.md): its runs and RunSpecs, and Tables I-III / Fig. 3."""
