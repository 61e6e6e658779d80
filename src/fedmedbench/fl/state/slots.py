"""Where a model's state_dict entries live, found once, so a model reused across client calls is read
and written without walking its modules each time.

``Module.state_dict()``, ``parameters()`` and ``buffers()`` visit every submodule: about 0.3 ms each
for ConvNeXtV2-nano's 201 modules, and a client call used to walk it four times (to check the device,
to load the broadcast, to snapshot the result, ...). On a GPU, where a round is bound by host work,
that is time the device waits. A :class:`StateSlots` records, for every entry, the dict that holds it
(its module's ``_parameters`` or ``_buffers``) and its name there, and reads the current tensor
through that dict: it stays right when a parameter's data or a buffer is replaced (``Module.to``,
``channels_last``), and assumes only that the module tree is not rebuilt, which the resident model's
reset (``job.Job``) assumes already.
"""

from __future__ import annotations

import torch


class StateSlots:
    """A model's state entries (parameters and persistent buffers, state_dict order) and all of its
    parameters and buffers, each as (the dict that holds it, its name there)."""

    def __init__(self, model: torch.nn.Module, entries: dict[str, tuple[dict, str]],
                 placed: list[tuple[dict, str]]) -> None:
        #: the model these slots belong to (a caller given another model reads that model's state_dict)
        self.model = model
        self._entries = entries
        self._placed = placed

    @classmethod
    def of(cls, model: torch.nn.Module) -> StateSlots | None:
        """The model's slots, or None where its state_dict is not exactly its parameters and persistent
        buffers (state_dict hooks, extra state): callers then use ``state_dict()`` as before."""
        entries: dict[str, tuple[dict, str]] = {}
        for prefix, module in model.named_modules(remove_duplicate=False):
            dot = f"{prefix}." if prefix else ""
            for name, t in module._parameters.items():
                if t is not None:
                    entries[dot + name] = (module._parameters, name)
            for name, t in module._buffers.items():
                if t is not None and name not in module._non_persistent_buffers_set:
                    entries[dot + name] = (module._buffers, name)
        state = model.state_dict(keep_vars=True)
        if list(state) != list(entries) or any(state[k] is not d[n] for k, (d, n) in entries.items()):
            return None
        placed = [(m._parameters, n) for m in model.modules() for n, t in m._parameters.items() if t is not None]
        placed += [(m._buffers, n) for m in model.modules() for n, t in m._buffers.items() if t is not None]
        return cls(model, entries, placed)

    def keys(self) -> list[str]:
        return list(self._entries)

    def tensors(self, keys: list[str]) -> list[torch.Tensor]:
        """The model's current tensors for ``keys`` (parameters as they are: write them under no_grad)."""
        entries = self._entries
        return [d[n] for d, n in (entries[k] for k in keys)]

    def state(self, keys: list[str] | None = None) -> dict[str, torch.Tensor]:
        """``{k: model.state_dict()[k]}`` for ``keys`` (default: all): detached, sharing the model's memory."""
        keys = self.keys() if keys is None else keys
        return {k: t.detach() for k, t in zip(keys, self.tensors(keys), strict=True)}

    def on(self, device: torch.device) -> bool:
        """True when every parameter and buffer is on ``device`` (an index-less device matches any index)."""
        device = torch.device(device)
        for d, n in self._placed:
            where = d[n].device
            if where.type != device.type or (device.index is not None and where.index != device.index):
                return False
        return True
