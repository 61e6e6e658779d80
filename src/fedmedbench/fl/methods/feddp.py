"""FedDP (Wang, Jin, Stoyanov, Wang, TMI 2023) as FedST's paper uses it: the query
embeddings of the attention encoder are personalised (kept per site), everything else is
shared and averaged. FedST's Table IV row 1 ("pure FedDP model as the baseline") is this
method on the network without temporal module, prompt or channel selection.

Only FedDP's query personalisation is reproduced here; its other component is not (see
docs/fedst.md, "left undone").
"""

from __future__ import annotations

from fedmedbench.fl.methods.fedst_base import SegMethod
from fedmedbench.fl.registry import register_method


@register_method("feddp")
class FedDP(SegMethod):
    defaults = {"personal": ["enc_q"]}
