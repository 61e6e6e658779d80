"""fedmedbench: federated-learning experiments on medical images and surgical video.

``compat`` is imported first on purpose: it sets offline switches and installs the
torchvision NMS fallback before any third-party library that needs them is imported.
"""

from fedmedbench import compat  # noqa: F401  (side effects: see compat's docstring)

__version__ = "0.1.0"
