"""Built-in methods; importing this package registers them."""

import fedmedbench.fl.methods.fedas  # noqa: F401  (study fedst)
import fedmedbench.fl.methods.feddp  # noqa: F401  (study fedst)
import fedmedbench.fl.methods.fedld  # noqa: F401  (study fedst)
import fedmedbench.fl.methods.fedrep  # noqa: F401  (study fedst)
import fedmedbench.fl.methods.fedst  # noqa: F401  (study fedst)
import fedmedbench.fl.methods.fedst_base  # noqa: F401  (study fedst)
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
