"""The one error type users see: it names the file, the op or tensor, and the reason."""

from __future__ import annotations


class ConversionError(Exception):
    """A model that cannot be converted correctly, said in one line.

    ``str(err)`` reads ``<file>: <where>: <reason>`` (empty parts left out); the CLI
    prints it and exits 2. Line breaks in any part (messages passed on from onnx's
    checker, say) are folded into spaces, so the message is always one line.
    """

    def __init__(self, source: str, where: str, reason: str) -> None:
        self.source, self.where, self.reason = _one_line(str(source)), _one_line(where), _one_line(reason)
        parts = [p for p in (self.source, self.where, self.reason) if p]
        super().__init__(": ".join(parts))


def _one_line(text: str) -> str:
    return " ".join(text.split()) if ("\n" in text or "\r" in text) else text.strip()
