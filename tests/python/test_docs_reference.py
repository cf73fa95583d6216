"""The API reference documents every name in ``__all__`` of the public modules.

Which modules are public is listed in ``docs/_ext/reference_coverage.py`` (every other
module is listed there as internal, with the reason). The test builds the docs with
Sphinx's dummy builder (autodoc reads the installed package, as ``scripts/docs.sh``
does), takes every Python object the reference documents, and asks the same check the
docs build runs which exported names no entry covers.
"""

from __future__ import annotations

import importlib.util
import json
import pathlib
import pkgutil
import subprocess
import sys
import textwrap
from typing import List, Set

import pytest

import tensorxfer

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs"


def _coverage_module():
    spec = importlib.util.spec_from_file_location("reference_coverage", DOCS / "_ext" / "reference_coverage.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


coverage = _coverage_module()


def package_modules() -> List[str]:
    """Every module of the installed package with no private part in its dotted name."""
    names = ["tensorxfer"]
    for info in pkgutil.walk_packages(tensorxfer.__path__, "tensorxfer."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            names.append(info.name)
    return names


def test_every_module_is_public_or_internal():
    public, internal = set(coverage.PUBLIC_MODULES), set(coverage.INTERNAL_MODULES)
    assert not public & internal, f"listed as both public and internal: {sorted(public & internal)}"
    modules = set(package_modules())
    unclassified = modules - public - internal
    assert not unclassified, (f"modules neither public nor internal: {sorted(unclassified)}; add each to "
                              "PUBLIC_MODULES or INTERNAL_MODULES in docs/_ext/reference_coverage.py")
    stale = (public | internal) - modules
    assert not stale, f"listed in docs/_ext/reference_coverage.py but not in the package: {sorted(stale)}"


_DUMP_OBJECTS = textwrap.dedent("""
    import json, sys
    from sphinx.application import Sphinx
    docs, out = sys.argv[1], sys.argv[2]
    app = Sphinx(docs, docs, out + "/dummy", out + "/doctrees", "dummy", status=None, warning=sys.stderr,
                 freshenv=True)
    app.build()
    objects = app.env.get_domain("py").objects
    print(json.dumps(sorted(name for name, entry in objects.items() if not entry.aliased)))
""")


@pytest.fixture(scope="module")
def documented(tmp_path_factory) -> Set[str]:
    """Every object the built reference has an entry for (a Sphinx build, about 10 s).

    Not the aliases a class's canonical name adds (``tensorxfer.ipc.slot_ring.SlotRing`` for
    ``tensorxfer.ipc.SlotRing``): they exist only beside the entry they point to.
    """
    if sys.version_info < (3, 11):
        pytest.skip("the docs tools (Sphinx 9) need Python 3.11 or newer")
    out = tmp_path_factory.mktemp("docs")
    result = subprocess.run([sys.executable, "-c", _DUMP_OBJECTS, str(DOCS), str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, timeout=600)
    assert result.returncode == 0, f"the docs build failed:\n{result.stderr[-6000:]}"
    return set(json.loads(result.stdout.splitlines()[-1]))


@pytest.mark.slow
def test_the_reference_documents_every_public_name(documented):
    missing = coverage.missing_names(documented)
    assert not missing, f"in __all__ of a public module but not in the API reference: {missing}"


@pytest.mark.slow
def test_the_check_reports_a_name_the_reference_lacks(documented):
    assert "tensorxfer.ipc.SlotRing" in documented
    missing = coverage.missing_names(documented - {"tensorxfer.ipc.SlotRing"})
    # The front door's entry also covers the module that defines the class; without it, both lack one.
    assert missing == ["tensorxfer.ipc.SlotRing", "tensorxfer.ipc.slot_ring.SlotRing"]


def test_a_documented_name_covers_only_the_same_object():
    # tensorxfer.runtime.collectives and tensorxfer.runtime.cuda_collectives both export a
    # DEFAULT_MAX_BYTES, of different values: one entry must not cover the other.
    assert coverage.missing_names({"tensorxfer.runtime.collectives.DEFAULT_MAX_BYTES"},
                                  modules=["tensorxfer.runtime.cuda_collectives"]) == [
        "tensorxfer.runtime.cuda_collectives.CudaCommunicator", "tensorxfer.runtime.cuda_collectives.DEFAULT_MAX_BYTES",
        "tensorxfer.runtime.cuda_collectives.DEFAULT_TIMEOUT"]
