"""Signatures of the native extension's classes and functions, read from its type stub.

pybind11 writes each signature into the docstring in C++ terms (``self:
tensorxfer._core.HostStream, dst: object``). The stub ``python/tensorxfer/_core.pyi``,
generated from the same bindings and checked against them by ``scripts/test.sh``, has
the Python signatures users call. This extension gives autodoc the stub's signature for
every object whose class or function lives in ``tensorxfer._core`` and drops the
C++-style signature lines from its docstring.
"""

from __future__ import annotations

import ast
import importlib
import pathlib
import re
from typing import Any, Dict, List, Optional, Tuple

NATIVE_MODULE = "tensorxfer._core"
# pybind11's docstring signature lines: "name(self: ..., x: int) -> None", and the
# "Overloaded function." header with its numbered lines.
_PYBIND_SIGNATURE = re.compile(r"^(\d+\. )?\w+\(.*\)( -> .+)?$")

Signature = Tuple[str, Optional[str]]


def read_stub(path: pathlib.Path) -> Dict[str, List[Signature]]:
    """Qualified name (``HostStream.enqueue_copy``) -> its signatures (overloads in order)."""
    tree = ast.parse(path.read_text())
    found: Dict[str, List[Signature]] = {}

    def visit(body: List[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                visit(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, ast.FunctionDef):
                arguments = node.args
                if prefix and arguments.args and arguments.args[0].arg == "self":
                    arguments = ast.arguments(posonlyargs=arguments.posonlyargs, args=arguments.args[1:],
                                              vararg=arguments.vararg, kwonlyargs=arguments.kwonlyargs,
                                              kw_defaults=arguments.kw_defaults, kwarg=arguments.kwarg,
                                              defaults=arguments.defaults)
                returns = ast.unparse(node.returns) if node.returns is not None else None
                found.setdefault(prefix + node.name, []).append((f"({ast.unparse(arguments)})", returns))

    visit(tree.body, "")
    return found


def native_qualname(name: str, obj: Any, what: str) -> Optional[str]:
    """The stub name of the object autodoc documents as ``name``, or None if it is not native."""
    if what in ("class", "exception"):
        if getattr(obj, "__module__", None) == NATIVE_MODULE:
            return f"{obj.__qualname__}.__init__"
        return None
    if what not in ("method", "function", "property", "attribute"):
        return None
    parent_name, _, member = name.rpartition(".")
    module_name, _, class_name = parent_name.rpartition(".")
    if what == "function":
        return member if getattr(obj, "__module__", None) == NATIVE_MODULE else None
    try:
        owner = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError, ValueError):
        return None
    if getattr(owner, "__module__", None) != NATIVE_MODULE:
        return None
    return f"{owner.__qualname__}.{member}"


def setup(app: Any) -> Dict[str, Any]:
    stub_path = pathlib.Path(app.confdir).parent / "python" / "tensorxfer" / "_core.pyi"
    signatures = read_stub(stub_path)
    app.add_config_value("native_stub", str(stub_path), "env")

    def process_signature(app: Any, what: str, name: str, obj: Any, options: Any, signature: Optional[str],
                          return_annotation: Optional[str]) -> Optional[Signature]:
        key = native_qualname(name, obj, what)
        if key is None or signature is None:
            # (Sphinx 9 cannot take a signature for an object it found none for: the class
            # signatures come from __init__'s docstring, autoclass_content = "both".)
            return None
        found = signatures.get(key)
        if not found:
            if what in ("class", "exception"):
                return None
            raise LookupError(f"{name}: {key} is native but not in {stub_path.name}; regenerate it "
                              "(scripts/gen_stubs.sh)")
        if what == "property":
            return None  # a property shows its type, not a call
        if what in ("class", "exception"):
            found = [(arguments, None) for arguments, _ in found]  # a class shows no "-> None"
        if len(found) == 1:
            return found[0]
        return "\n".join(arguments + (f" -> {returns}" if returns else "") for arguments, returns in found), None

    def process_docstring(app: Any, what: str, name: str, obj: Any, options: Any, lines: List[str]) -> None:
        if native_qualname(name, obj, what) is None:
            return
        # pybind11 starts each docstring with its C++-style signature(s): the stub's replace them.
        while lines and (_PYBIND_SIGNATURE.match(lines[0]) or lines[0] in ("", "Overloaded function.")):
            lines.pop(0)

    app.connect("autodoc-process-signature", process_signature)
    app.connect("autodoc-process-docstring", process_docstring)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
