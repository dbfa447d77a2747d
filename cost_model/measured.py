"""Measured per-op timings for one device, cached as JSON.

File layout (``schema_version`` 1)::

    {"schema_version": 1, "device": "h100", "created": "2025-01-01T00:00:00+00:00",
     "entries": {"<key>": {"float32": seconds, "float16": seconds, ...}}}

Keys are opaque strings chosen by whoever records the profile (e.g. an op type plus
its shape signature); dtype names are stored in canonical form (float32/float16/...).
"""

from __future__ import annotations

import json
import math
import os
from datetime import datetime, timezone
from pathlib import Path

from .dtypes import canonical_dtype

__all__ = ["MeasuredProfile", "SCHEMA_VERSION", "PROFILES_DIR", "default_profile_path"]

SCHEMA_VERSION = 1
PROFILES_DIR = Path(__file__).resolve().parent / "profiles"


def default_profile_path(device_name: str) -> Path:
    """Where the shipped measured profile of ``device_name`` lives (may not exist)."""
    return PROFILES_DIR / f"{device_name.strip().lower()}.json"


class MeasuredProfile:
    """Per-(key, dtype) measured op times in seconds for one device."""

    def __init__(
        self,
        device: str,
        entries: dict[str, dict[str, float]] | None = None,
        created: str | None = None,
    ) -> None:
        self.device = device.strip().lower()
        self.created = created or datetime.now(timezone.utc).isoformat(timespec="seconds")
        self.entries: dict[str, dict[str, float]] = {}
        for key, per_dtype in (entries or {}).items():
            for dtype, seconds in per_dtype.items():
                self.record(key, dtype, seconds)

    def __len__(self) -> int:
        return len(self.entries)

    def __repr__(self) -> str:
        return f"MeasuredProfile(device={self.device!r}, entries={len(self.entries)})"

    def record(self, key: str, dtype: str, seconds: float) -> None:
        """Store the measured time of op ``key`` run in ``dtype``."""
        seconds = float(seconds)
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"measured time must be a finite non-negative number, got {seconds!r}")
        self.entries.setdefault(str(key), {})[canonical_dtype(dtype)] = seconds

    def lookup(self, key: str, dtype: str) -> float | None:
        """Measured seconds for ``(key, dtype)``, or None when not measured."""
        per_dtype = self.entries.get(key)
        if per_dtype is None:
            return None
        return per_dtype.get(canonical_dtype(dtype))

    def to_dict(self) -> dict:
        return {
            "schema_version": SCHEMA_VERSION,
            "device": self.device,
            "created": self.created,
            "entries": {k: dict(v) for k, v in self.entries.items()},
        }

    def save(self, path: str | os.PathLike | None = None) -> Path:
        """Write atomically (``amp_compiler.atomic.atomic_write``, the one writer); returns the path.

        ``path`` defaults to :func:`default_profile_path` of this profile's device.
        """
        from amp_compiler.atomic import atomic_write  # late: cost_model imports on its own

        path = Path(path) if path is not None else default_profile_path(self.device)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, (json.dumps(self.to_dict(), indent=1, sort_keys=True) + "\n").encode("utf-8"))
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "MeasuredProfile":
        """Read a profile; a malformed file raises ValueError naming the file and the problem."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"measured profile {path}: not UTF-8 text ({e})") from e
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"measured profile {path}: invalid JSON ({e})") from e
        return cls._from_dict(data, path)

    @classmethod
    def _from_dict(cls, data: object, path: Path) -> "MeasuredProfile":
        def bad(what: str) -> ValueError:
            return ValueError(f"measured profile {path}: {what}")

        if not isinstance(data, dict):
            raise bad(f"top level must be a JSON object, got {type(data).__name__}")
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise bad(f"unsupported schema_version {version!r} (expected {SCHEMA_VERSION})")
        device = data.get("device")
        if not isinstance(device, str) or not device.strip():
            raise bad("'device' must be a non-empty string")
        created = data.get("created")
        if created is not None and not isinstance(created, str):
            raise bad("'created' must be an ISO date string")
        entries = data.get("entries")
        if not isinstance(entries, dict):
            raise bad("'entries' must be a JSON object")
        profile = cls(device, created=created)
        for key, per_dtype in entries.items():
            if not isinstance(per_dtype, dict):
                raise bad(f"entry {key!r} must map dtype names to seconds")
            for dtype, seconds in per_dtype.items():
                if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
                    raise bad(f"entry {key!r}/{dtype!r}: time must be a number, got {seconds!r}")
                try:
                    profile.record(key, dtype, seconds)
                except ValueError as e:
                    raise bad(f"entry {key!r}/{dtype!r}: {e}") from e
        return profile
