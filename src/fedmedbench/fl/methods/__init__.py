"""Built-in methods; importing this package registers them."""

from fedmedbench.fl.methods import centralized, fedavg, feddg, gpaf, local, moon  # noqa: F401
