"""A hostile site for the live deployment tests: on the PYTHONPATH of one SuperNode (and so of the ClientApp
processes it starts), it edits that site's training replies as the file named by ``FEDMEDBENCH_TEST_HOSTILE``
says: ``honest``, ``nan`` (a model array of NaN) or ``shape`` (a model array cut to one value).

Flower's SuperNode starts its SuperExec, and that one ``flwr-clientapp`` process per message, each with the
SuperNode's environment, so this file runs in each; the edit is made when ``fedmedbench.fl.engine.federation``
is executed (an import hook), which the ClientApp reaches through Flower's app loader. A reply without a model
array to edit (UltraFlwr's last round sends none: its final aggregation is omitted) fails the ClientApp with a
line saying so, rather than going out honest."""

import importlib.abc
import os
import sys

_MODE_FILE = os.environ.get("FEDMEDBENCH_TEST_HOSTILE")
_TARGET = "fedmedbench.fl.engine.federation"


def _hostile(module) -> None:
    honest = module.client_train

    def client_train(job, pid, rnd, *args, **kwargs):
        result = honest(job, pid, rnd, *args, **kwargs)
        with open(_MODE_FILE) as fh:
            mode = fh.read().strip()
        key = next((k for k in sorted(result.arrays) if result.arrays[k].is_floating_point()), None)
        if key is not None and mode == "nan":
            result.arrays[key] = result.arrays[key] * float("nan")
        elif key is not None and mode == "shape":
            result.arrays[key] = result.arrays[key].reshape(-1)[:1].clone()
        elif mode != "honest":
            raise RuntimeError(f"hostile site: round {rnd}'s reply holds no model array to make '{mode}'")
        return result

    module.client_train = client_train


class _Loader(importlib.abc.Loader):
    def __init__(self, inner) -> None:
        self.inner = inner

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module) -> None:
        self.inner.exec_module(module)
        _hostile(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != _TARGET:
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                spec.loader = _Loader(spec.loader)
                return spec
        return None


if _MODE_FILE:
    sys.meta_path.insert(0, _Finder())
