"""Built-in methods; importing this package registers them."""

from fedmedbench.fl.methods import centralized, fedavg, local  # noqa: F401
