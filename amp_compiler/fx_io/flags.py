"""The Python flags a capture bakes in (docs/architecture.md, "Capture routes and shapes").

torch.export runs ``forward``'s Python once: ``if self.use_gate:`` or ``if config.output_hidden_states:``
is decided at capture, and a plan made with the flag off kept running after the user set it on
(silently wrong outputs). ``torch.compile`` guards on such attributes; an ``AmpModule`` keys its
routes by them: ``FlagWatch`` reads every submodule's (and its ``config``'s) attributes holding a
bool, int, float, str or None, and a call after one changed runs a route planned for the new values
(with a warning naming the attribute). Attributes the forward itself writes (a counter, a cache
length) are state, not flags: a call that changes them, or ``RESTLESS`` new routes made by their
changes (an eager call between planned ones), stops their watch, with a warning.
"""

from __future__ import annotations

from typing import Callable

import torch

_SCALARS = (bool, int, float, str, type(None))
#: an attribute whose changes made this many new routes is taken as state, and no longer watched
RESTLESS = 3


class FlagWatch:
    """The scalar attributes (bool, int, float, str, None) of a model's submodules and ``config``, found
    once; ``values()`` reads them (a few µs per hundred, cheap enough for every call)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.slots: list[tuple[dict, str, str]] = []  # (the object's __dict__, attribute, name for messages)
        self.changes: dict[int, int] = {}  # by slot: how many new routes its changes made
        seen: set[int] = set()
        for name, module in model.named_modules():
            for attr, value in vars(module).items():
                if attr.startswith("_") or attr == "training":
                    continue
                if isinstance(value, _SCALARS):
                    self.slots.append((vars(module), attr, f"{name}.{attr}" if name else attr))
                elif attr == "config" and id(value) not in seen and hasattr(value, "__dict__"):
                    seen.add(id(value))
                    prefix = f"{name}.config" if name else "config"
                    self.slots += [(vars(value), k, f"{prefix}.{k}") for k, v in vars(value).items()
                                   if not k.startswith("_") and isinstance(v, _SCALARS)]

    def values(self) -> tuple:
        return tuple(d.get(attr) for d, attr, _ in self.slots)

    def forget(self, before: tuple, after: tuple) -> Callable[[tuple], tuple]:
        """Stop watching the attributes that differ between two ``values()`` (the forward wrote them: state,
        not flags); returns the function dropping them from an older ``values()`` (a route's key)."""
        return self.drop({i for i, (a, b) in enumerate(zip(before, after)) if a != b})

    def drop(self, gone: set[int]) -> Callable[[tuple], tuple]:
        """Stop watching the attributes at ``gone``; the function dropping them from a ``values()``."""
        self.slots = [slot for i, slot in enumerate(self.slots) if i not in gone]
        self.changes = {i - sum(1 for j in gone if j < i): n for i, n in self.changes.items() if i not in gone}
        return lambda values: tuple(v for i, v in enumerate(values) if i not in gone)

    def restless(self, before: tuple, after: tuple) -> list[int]:
        """Count a change of flags that made a new route; the indices of the attributes changed
        ``RESTLESS`` times or more (a counter: state, whatever writes it)."""
        for i, (a, b) in enumerate(zip(before, after)):
            if a != b:
                self.changes[i] = self.changes.get(i, 0) + 1
        return sorted(i for i, n in self.changes.items() if n >= RESTLESS)

    def describe(self, before: tuple, after: tuple) -> str:
        """``use_gate False -> True`` for the attributes that differ (at most three named)."""
        diff = [f"{slot[2]} {a!r} -> {b!r}" for slot, a, b in zip(self.slots, before, after) if a != b]
        return ", ".join(diff[:3]) + (f" and {len(diff) - 3} more" if len(diff) > 3 else "")


__all__ = ["RESTLESS", "FlagWatch"]
