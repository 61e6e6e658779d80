"""Built-in methods, one file each; they register when first looked up (``fl/api/registry.py``)."""
