"""The unified-memory exceptions and the translation of core errors into them."""

from __future__ import annotations

import contextlib
from typing import Iterator

from tensorxfer.errors import UnsupportedError

_PUBLIC_MODULE = "tensorxfer.inference.unified_memory"


class UnifiedMemoryUnsupportedError(UnsupportedError):
    """Unified memory is not supported on this system."""

    __module__ = _PUBLIC_MODULE


class UnifiedMemoryCompileTimeoutError(UnifiedMemoryUnsupportedError):
    """Unified memory compilation timed out."""

    __module__ = _PUBLIC_MODULE


@contextlib.contextmanager
def unified_errors() -> Iterator[None]:
    """Re-raises the core's UnsupportedError as UnifiedMemoryUnsupportedError."""
    try:
        yield
    except UnifiedMemoryUnsupportedError:
        raise
    except UnsupportedError as exc:
        raise UnifiedMemoryUnsupportedError(str(exc)) from exc
