"""Load a script that is not in a package (examples/, docs/) as a module, once per process."""

from __future__ import annotations

import importlib.util
import pathlib
import sys
from types import ModuleType


def load_script(path: pathlib.Path, name: str) -> ModuleType:
    """The module at ``path``, executed on first use and cached in ``sys.modules`` as ``name``.

    Cached because some scripts have import-time effects that may run only once (registering
    custom ops); a failed first execution is not cached, so its error shows again.
    """
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
    return sys.modules[name]
