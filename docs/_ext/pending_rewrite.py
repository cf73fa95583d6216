"""Docstring problems of ``tensorxfer.resharding`` are listed, not fatal, while issue 37 rewrites it.

The reference documents ``tensorxfer.resharding`` from its docstrings as they are. Some
of them predate the docs build: code shown as an indented paragraph instead of a
literal block (``::``), properties whose first line reads as a ``type: description``
field, references to names the reference does not have. The package is being rewritten
(refit across hosts, issue 37) by its owner, so its files are not edited here; instead
the warnings Sphinx raises on its docstrings are set aside and printed at the end of the
build (and written to ``<outdir>/../pending-docstrings.txt``), so every other warning
still fails the build.

Delete this extension (and its line in conf.py) once the rewrite has landed: from then
on the package's docstrings are checked like every other module's.
"""

from __future__ import annotations

import logging
import pathlib
from typing import Any, Dict, List

PACKAGE = "tensorxfer.resharding"
_SOURCE_PART = "/tensorxfer/resharding/"


def _location(record: logging.LogRecord) -> str:
    location = getattr(record, "location", None)
    if location is None:
        return ""
    if isinstance(location, str):
        return location
    if isinstance(location, tuple):
        return ":".join(str(part) for part in location if part is not None)
    from sphinx.util.logging import get_node_location

    return get_node_location(location) or ""


def _message(record: logging.LogRecord) -> str:
    try:
        return str(record.msg) % record.args if record.args else str(record.msg)
    except (TypeError, ValueError):
        return str(record.msg)


class PendingRewriteFilter(logging.Filter):
    """Holds back the warnings raised on the package's docstrings (and only those)."""

    def __init__(self) -> None:
        super().__init__()
        self.held: List[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING or getattr(record, "type", "") == "reference":
            return True
        location = _location(record)
        message = _message(record)
        if _SOURCE_PART in location or f"docstring of {PACKAGE}." in location:
            pass
        elif location in ("", "<unknown>") or location.startswith("<unknown>"):
            # Signature and base-class references carry no source: judge them by their target.
            if PACKAGE not in message:
                return True
        else:
            return True
        entry = f"{location}: {message}" if location else message
        if entry not in self.held:
            self.held.append(entry)
        return False


def setup(app: Any) -> Dict[str, Any]:
    from sphinx.util.logging import NAMESPACE, WarningStreamHandler

    held = PendingRewriteFilter()
    for handler in logging.getLogger(NAMESPACE).handlers:
        if isinstance(handler, WarningStreamHandler):
            handler.filters.insert(0, held)  # before Sphinx counts the warning

    def report(app: Any, exception: Any) -> None:
        from sphinx.util import logging as sphinx_logging

        logger = sphinx_logging.getLogger(__name__)
        out = pathlib.Path(app.outdir).parent / "pending-docstrings.txt"
        out.write_text("".join(f"{entry}\n" for entry in held.held))
        if held.held:
            logger.info("%d docstring problems in %s, listed and not fatal until issue 37's rewrite lands "
                        "(docs/_ext/pending_rewrite.py; the list: %s):", len(held.held), PACKAGE, out)
            for entry in held.held:
                logger.info("    %s", entry)

    app.connect("build-finished", report)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
