"""The one error type users see: it names the file, the op or tensor, and the reason."""

from __future__ import annotations


class ConversionError(Exception):
    """A model that cannot be converted correctly, said in one line.

    ``str(err)`` reads ``<file>: <where>: <reason>``; the CLI prints it and exits 2.
    """

    def __init__(self, source: str, where: str, reason: str) -> None:
        self.source, self.where, self.reason = str(source), where, reason
        parts = [p for p in (self.source, where, reason) if p]
        super().__init__(": ".join(parts))
