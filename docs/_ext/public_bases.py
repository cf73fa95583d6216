"""Show a class's public ancestors as its bases, never a private class.

``ShmCopyService`` derives from ``tensorxfer.resharding.copy_services._service.QueuedCopyService``,
an implementation class the reference does not document (nor should it): a base shown
as such would be a dead link. Each base whose module path has a part starting with
``_`` is replaced by its own bases, recursively, until only public classes are left.
"""

from __future__ import annotations

from typing import Any, Dict, List


def is_private(cls: type) -> bool:
    """True for a class defined in a private module, or with a private name.

    pybind11's own base of every native class (``pybind11_builtins.pybind11_object``)
    counts as private too: it is how the extension is built, not what it offers.
    """
    module = getattr(cls, "__module__", "") or ""
    return (cls.__name__.startswith("_") or module == "pybind11_builtins"
            or any(part.startswith("_") for part in module.split(".")))


def public_bases(bases: List[type]) -> List[type]:
    """``bases`` with every private class replaced by its nearest public ancestors, in order."""
    found: List[type] = []
    for base in bases:
        for public in (public_bases(list(base.__bases__)) if is_private(base) else [base]):
            if public not in found and public is not object:
                found.append(public)
    return found


def _process_bases(app: Any, name: str, obj: Any, options: Any, bases: List[type]) -> None:
    bases[:] = public_bases(list(bases))


def setup(app: Any) -> Dict[str, Any]:
    app.connect("autodoc-process-bases", _process_bases)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
