"""tensorxfer's copy services as Megatron's, without importing Megatron (private).

megatron-core's ``swap_model_weights(src, dst, refit_method=service)`` accepts a service only
if ``isinstance(service, megatron.core.resharding.copy_services.base.CopyService)``. That
class is an ``abc.ABC``, so tensorxfer's base class is registered as a virtual subclass of
it: at once when Megatron's module is already imported, else by an import hook the moment it
is (a meta-path finder that wraps that one module's loader and removes itself after). Nothing
here imports Megatron, and importing ``tensorxfer`` alone installs nothing: the copy services'
base module does, when it is imported.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from types import ModuleType
from typing import Optional, Sequence

#: The module that defines Megatron's CopyService base class.
MEGATRON_BASE = "megatron.core.resharding.copy_services.base"

_service_class: Optional[type] = None
_hook: Optional["_MegatronBaseHook"] = None


def register_with_megatron() -> bool:
    """Registers tensorxfer's CopyService with Megatron's if Megatron's module is imported;
    returns whether it is registered (never imports Megatron)."""
    module = sys.modules.get(MEGATRON_BASE)
    base = getattr(module, "CopyService", None)
    if base is None or _service_class is None:
        return False
    if not issubclass(_service_class, base):
        base.register(_service_class)
    return True


class _RegisterAfterLoad(importlib.abc.Loader):
    """Runs Megatron's loader, then registers."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Optional[ModuleType]:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)  # type: ignore[attr-defined]
        _remove_hook()
        try:
            register_with_megatron()
        except Exception as error:  # never break Megatron's import
            import warnings

            warnings.warn(f"tensorxfer: could not register its copy services with Megatron: {error!r}",
                          RuntimeWarning, stacklevel=2)


class _MegatronBaseHook(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the loader the other finders give MEGATRON_BASE."""

    def find_spec(self, fullname: str, path: Optional[Sequence[str]],
                  target: Optional[ModuleType] = None) -> Optional[importlib.machinery.ModuleSpec]:
        if fullname != MEGATRON_BASE:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _RegisterAfterLoad(spec.loader)
                return spec
        return None


def _remove_hook() -> None:
    global _hook
    if _hook is not None and _hook in sys.meta_path:
        sys.meta_path.remove(_hook)
    _hook = None


def register_when_megatron_is_imported(service_class: type) -> None:
    """Makes ``service_class`` a virtual subclass of Megatron's CopyService now, if Megatron's
    module is imported, else as soon as it is."""
    global _service_class, _hook
    _service_class = service_class
    if register_with_megatron():
        return
    if _hook is None:
        _hook = _MegatronBaseHook()
        sys.meta_path.insert(0, _hook)


def is_registered_with_megatron() -> bool:
    """True when Megatron's CopyService is imported and tensorxfer's services are its instances."""
    base = getattr(sys.modules.get(MEGATRON_BASE), "CopyService", None)
    return base is not None and _service_class is not None and issubclass(_service_class, base)


__all__ = ["MEGATRON_BASE", "is_registered_with_megatron", "register_when_megatron_is_imported",
           "register_with_megatron"]
