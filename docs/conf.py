"""Sphinx configuration of the tensorxfer documentation (built by scripts/docs.sh)."""

from __future__ import annotations

import pathlib
import sys

DOCS = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(DOCS / "_ext"))

import tensorxfer  # noqa: E402  (the installed package: the reference documents what users import)

project = "tensorxfer"
author = "the tensorxfer authors"
copyright = "the tensorxfer authors"
release = tensorxfer.__version__
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.intersphinx",
    "native_signatures",
    "public_bases",
    "reference_coverage",
]

source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_ext", "_inventories", "README.md"]
# ``x`` in a docstring is code; so is a single-backtick `x` (the native bindings' style).
default_role = "literal"
nitpicky = True

# MyST: headings get anchors down to level 3, so pages link to sections (``page.md#anchor``).
myst_heading_anchors = 3

# Docstrings: Google style (ruff's pydocstyle rules check it), read by napoleon.
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
napoleon_use_ivar = True
# Each automodule names its members: ":members:" alone documents every name in __all__.
autodoc_default_options = {
    "undoc-members": True,
    "show-inheritance": True,
    "member-order": "bysource",
}
autodoc_typehints = "signature"
autodoc_typehints_format = "short"
autodoc_preserve_defaults = True
autodoc_class_signature = "mixed"
autoclass_content = "both"
# A signature in the reference may name a private class it does not document: LocalRun.run
# takes the copy services' submit queue's ``take``, which returns its private Columns.
nitpick_ignore = [("py:class", "tensorxfer.resharding.copy_services._queue.Columns")]

# Intersphinx from inventories kept in the checkout (docs/_inventories, see its README):
# the build never fetches anything.
INVENTORIES = DOCS / "_inventories"
intersphinx_mapping = {
    "python": ("https://docs.python.org/3/", str(INVENTORIES / "python.inv")),
    "numpy": ("https://numpy.org/doc/stable/", str(INVENTORIES / "numpy.inv")),
    "torch": ("https://docs.pytorch.org/docs/stable/", str(INVENTORIES / "torch.inv")),
}
intersphinx_timeout = 1

html_theme = "furo"
html_title = f"tensorxfer {release}"
html_static_path: list = []
html_show_sourcelink = False


# Classes built by named constructors (``create`` / ``attach`` / ``join`` / ``serve`` /
# ``connect``, or a ``build_`` function): their ``__init__`` takes the native object or the
# session they wrap, which no user makes, so the reference shows the class without a call
# signature and documents the named constructors instead.
NAMED_CONSTRUCTORS = {
    "tensorxfer.ipc.slot_ring.SlotRing",
    "tensorxfer.ipc.shared_array.SharedArray",
    "tensorxfer.ipc.remote.learner.RemoteProducers",
    "tensorxfer.ipc.remote.producer.RemoteSlotRing",
    "tensorxfer.runtime.group.LocalGroup",
    "tensorxfer.runtime.ipc_memory.IpcMemory",
    "tensorxfer.resharding.persistent_plan.PersistentPlan",
}


def _hide_private_constructors(app, what, name, obj, options, signature, return_annotation):
    if what == "class" and f"{obj.__module__}.{obj.__qualname__}" in NAMED_CONSTRUCTORS:
        return "", None
    return None


def setup(app):
    app.connect("autodoc-process-signature", _hide_private_constructors)
