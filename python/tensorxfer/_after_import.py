"""Run a function once a module is imported, without importing it (private).

Registration with an optional library (torch.distributed's backend table, Megatron's
CopyService base) must happen whether the library is imported before or after tensorxfer, and
importing tensorxfer must not import it. The caller registers at once when the library is
already imported (it knows best when that is: torch counts only once ``torch.distributed`` is
there too); otherwise :func:`call_after_import` puts a meta-path finder first on
``sys.meta_path`` that answers for that one module name only: it asks the other finders for the module's spec,
wraps its loader so that the function runs right after the module executed, and removes
itself. The function must never break the import that triggers it: a failure becomes a
RuntimeWarning (:func:`call_warning_on_failure`).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType
from typing import Callable, Dict, Optional, Sequence

_hooks: Dict[str, "_OneModuleHook"] = {}


def call_warning_on_failure(function: Callable[[], object], failure: str) -> None:
    """Calls ``function``; an exception becomes a RuntimeWarning ``tensorxfer: {failure}: {error!r}``."""
    try:
        function()
    except Exception as error:  # noqa: BLE001 - never break the import that triggered it
        warnings.warn(f"tensorxfer: {failure}: {error!r}", RuntimeWarning, stacklevel=3)


def call_after_import(module_name: str, function: Callable[[], object], failure: str) -> None:
    """Calls ``function`` right after ``module_name`` is next imported (once; a second call for
    the same module while the first waits changes nothing)."""
    if module_name not in _hooks:
        hook = _OneModuleHook(module_name, function, failure)
        _hooks[module_name] = hook
        sys.meta_path.insert(0, hook)


def _remove_hook(module_name: str) -> None:
    hook = _hooks.pop(module_name, None)
    if hook is not None and hook in sys.meta_path:
        sys.meta_path.remove(hook)


class _RunAfterExec(importlib.abc.Loader):
    """The module's own loader, then the function."""

    def __init__(self, loader: importlib.abc.Loader, hook: "_OneModuleHook") -> None:
        self._loader = loader
        self._hook = hook

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Optional[ModuleType]:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)  # type: ignore[attr-defined]
        _remove_hook(self._hook.module_name)
        call_warning_on_failure(self._hook.function, self._hook.failure)


class _OneModuleHook(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the loader that the other finders give ``module_name``."""

    def __init__(self, module_name: str, function: Callable[[], object], failure: str) -> None:
        self.module_name = module_name
        self.function = function
        self.failure = failure

    def find_spec(self, fullname: str, path: Optional[Sequence[str]],
                  target: Optional[ModuleType] = None) -> Optional[importlib.machinery.ModuleSpec]:
        if fullname != self.module_name:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _RunAfterExec(spec.loader, self)
                return spec
        return None


__all__ = ["call_after_import", "call_warning_on_failure"]
