"""tensorxfer's copy services as Megatron's, without importing Megatron (private).

megatron-core's ``swap_model_weights(src, dst, refit_method=service)`` accepts a service only
if ``isinstance(service, megatron.core.resharding.copy_services.base.CopyService)``. That
class is an ``abc.ABC``, so tensorxfer's base class is registered as a virtual subclass of
it: at once when Megatron's module is already imported, else the moment it is
(``tensorxfer._after_import``). Nothing
here imports Megatron, and importing ``tensorxfer`` alone installs nothing: the copy services'
base module does, when it is imported.
"""

from __future__ import annotations

import sys
from typing import Optional

from tensorxfer._after_import import call_after_import

#: The module that defines Megatron's CopyService base class.
MEGATRON_BASE = "megatron.core.resharding.copy_services.base"

_service_class: Optional[type] = None


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


def register_when_megatron_is_imported(service_class: type) -> None:
    """Makes ``service_class`` a virtual subclass of Megatron's CopyService now, if Megatron's
    module is imported, else as soon as it is."""
    global _service_class
    _service_class = service_class
    if not register_with_megatron():
        call_after_import(MEGATRON_BASE, register_with_megatron,
                          "could not register its copy services with Megatron")


def is_registered_with_megatron() -> bool:
    """True when Megatron's CopyService is imported and tensorxfer's services are its instances."""
    base = getattr(sys.modules.get(MEGATRON_BASE), "CopyService", None)
    return base is not None and _service_class is not None and issubclass(_service_class, base)


__all__ = ["MEGATRON_BASE", "is_registered_with_megatron", "register_when_megatron_is_imported",
           "register_with_megatron"]
