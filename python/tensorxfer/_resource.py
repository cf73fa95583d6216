"""The lifetime rules shared by every object that owns a native shared resource."""

from __future__ import annotations

from typing import Any

from tensorxfer.errors import ClosedError


class SharedResource:
    """Base of objects that own a native shared resource (a ring, a shared array).

    ``close()`` is idempotent and also runs on context-manager exit and when the
    object is garbage collected (never raising there). After it, methods that
    need the resource raise :class:`tensorxfer.errors.ClosedError` (``"<kind> is closed"``,
    a ``ValueError``). Such objects
    refuse pickling: another process attaches through the object's ``handle``.
    Subclasses set ``_kind`` and ``_share_hint`` and implement ``_release``.
    """

    _kind = "resource"
    _share_hint = "pass its .handle and attach in the other process"
    _closed = True  # until a subclass's constructor succeeds, nothing is owned

    def _release(self) -> None:
        """Releases the native resource; called once, by the first close()."""

    def _ensure_open(self) -> None:
        if self._closed:
            raise ClosedError(f"{self._kind} is closed")

    @property
    def closed(self) -> bool:
        """True after :meth:`close`."""
        return self._closed

    def close(self) -> None:
        """Releases the resource. Idempotent."""
        if not self._closed:
            self._closed = True
            self._release()

    def __enter__(self) -> Any:
        self._ensure_open()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - never raise from a finalizer
            pass

    def __reduce__(self) -> Any:
        raise TypeError(f"{type(self).__name__} objects cannot be pickled; {self._share_hint}")
