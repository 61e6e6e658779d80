"""Built-in methods; importing this package registers them."""

from fedmedbench.fl.methods import (  # noqa: F401
    centralized,
    fedavg,
    feddg,
    feddyn,
    fedgamma,
    fedlesam,
    fedprox,
    fedsam,
    fedsmoo,
    fedspeed,
    fedwmsam,
    gpaf,
    local,
    moon,
    scaffold,
    ultraflwr,
)
