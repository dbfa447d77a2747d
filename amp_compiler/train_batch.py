"""The training step's batch as a tree (docs/architecture.md, "Training"): positional items, each a
tensor, a constant or a nested dict/list/tuple of them (a Hugging Face collator's ``BatchEncoding``).

The capture takes the tree's tensor leaves, flattened with ``torch.utils._pytree``, as graph inputs;
its structure and its constant leaves (None, bools, ints, floats, strings: the trace bakes them in)
are part of the capture key, and the model and ``loss_fn`` are called with the tree rebuilt. A batch
must have the example's structure (its containers, their keys, and tensors where the example has
tensors, of the same dims and dtype): anything else is refused before it runs, naming where it differs.
A dict with the example's keys in another order (a collator that builds it otherwise) is taken in the
example's order (``in_example_order``): ``model(**batch)`` and a ``loss_fn`` reading by key do not see
the order, and the capture's inputs are the leaves in the example's order.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils import _pytree as pytree

CONSTANTS = (type(None), bool, int, float, str, torch.dtype, torch.device)


@dataclass(frozen=True)
class TensorSlot:
    """Where the example had a tensor: what a batch must have there."""

    dim: int
    dtype: torch.dtype


@dataclass(frozen=True)
class BatchTree:
    """A batch's structure and constant leaves: with its tensor leaves, the batch (``unflatten``)."""

    spec: pytree.TreeSpec
    constants: tuple[tuple[int, type, Any], ...]  # (leaf index, type, value): bool True is not int 1

    def unflatten(self, tensors: list[torch.Tensor]) -> tuple:
        leaves, it, consts = [], iter(tensors), {i: v for i, _, v in self.constants}
        for i in range(self.spec.num_leaves):
            leaves.append(consts[i] if i in consts else next(it))
        return pytree.tree_unflatten(leaves, self.spec)

    def changed_constants(self, other: BatchTree) -> str:
        """``batch item 1['flag']=False``: the constants whose values differ from ``other``'s (same structure)."""
        if other.spec != self.spec:
            return ""
        items = pytree.tree_unflatten(list(range(self.spec.num_leaves)), self.spec)
        paths = [_where(items, path) for path, _ in pytree.tree_flatten_with_path(items)[0]]
        theirs = {i: (t, v) for i, t, v in other.constants}
        return ", ".join(f"{paths[i]}={v!r}" for i, t, v in self.constants if theirs.get(i) != (t, v))


def plain(value: Any) -> Any:
    """``value`` with every mapping made a ``dict`` (a ``BatchEncoding``, a ``UserDict``: pytree leaves
    otherwise, so their tensors would not be found) and lists, tuples and named tuples rebuilt likewise."""
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, tuple) and hasattr(type(value), "_fields"):
        return type(value)(*(plain(v) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(plain(v) for v in value)
    return value


def flatten(items: tuple) -> tuple[list[torch.Tensor], BatchTree]:
    """The tensor leaves of a batch (graph inputs, in pytree order) and its structure with its constants."""
    leaves, spec = pytree.tree_flatten(items)
    tensors = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
    constants = tuple((i, type(leaf), leaf) for i, leaf in enumerate(leaves) if not isinstance(leaf, torch.Tensor))
    return tensors, BatchTree(spec, constants)


def template(items: tuple, what: str) -> tuple:
    """The example batch with its tensors replaced by ``TensorSlot``s (the example's tensors are not kept);
    a leaf that is neither a tensor nor a constant is refused, naming it."""
    for path, leaf in pytree.tree_flatten_with_path(items)[0]:
        if not isinstance(leaf, (torch.Tensor, *CONSTANTS)):
            raise ValueError(f"compile_training: {_where(items, path)} of {what} is a {type(leaf).__name__}: the step "
                             f"takes tensors, in tuples, lists and dicts, and None/bool/int/float/str constants "
                             f"(each value a capture of its own)")
    return pytree.tree_map(lambda t: TensorSlot(t.dim(), t.dtype) if isinstance(t, torch.Tensor) else t, items)


def in_example_order(want: Any, got: Any) -> Any:
    """``got`` with every dict that holds the same keys as the example's (``template``) rebuilt in the
    example's key order; anything unlike the example is left as it is, for ``check_like`` to name."""
    if isinstance(want, dict) and isinstance(got, dict) and got.keys() == want.keys():
        return {k: in_example_order(want[k], got[k]) for k in want}
    if isinstance(want, (list, tuple)) and type(got) is type(want) and len(got) == len(want):
        rebuilt = (in_example_order(w, g) for w, g in zip(want, got))
        return type(got)(*rebuilt) if hasattr(type(got), "_fields") else type(got)(rebuilt)
    return got


def check_like(want: tuple, items: tuple) -> None:
    """Refuse a batch unlike the example (``template``), naming where; constants may take other values."""
    if len(items) != len(want):
        got = f" (a {type(items[0]).__name__}: {_keys(items[0])})" if len(items) == 1 and isinstance(items[0], dict) \
            else ""
        kind = "tensors" if all(isinstance(w, TensorSlot) for w in want) else "items"
        raise ValueError(f"compile_training: the step takes {len(want)} batch {kind} (like the example batch), got "
                         f"{len(items)}{got}")
    for i, (w, got) in enumerate(zip(want, items)):
        _like(w, got, "batch" if len(want) == 1 and isinstance(want[0], dict) else f"batch item {i}")


def _like(want: Any, got: Any, where: str) -> None:
    if isinstance(want, TensorSlot):
        if not isinstance(got, torch.Tensor):
            raise ValueError(f"compile_training: {where} is a {type(got).__name__}, the example's is a tensor")
        if got.dim() != want.dim or got.dtype != want.dtype:
            raise ValueError(f"compile_training: {where} is {got.dtype} with {got.dim()} dims, the example's is "
                             f"{want.dtype} with {want.dim} dims")
        return
    if isinstance(want, CONSTANTS):
        if not isinstance(got, CONSTANTS):
            raise ValueError(f"compile_training: {where} is a {type(got).__name__}, the example's is the constant "
                             f"{want!r} (a constant of the capture: pass a tensor in the example for a tensor input)")
        return
    if type(got) is not type(want):
        raise ValueError(f"compile_training: {where} is a {type(got).__name__}, the example's is a "
                         f"{type(want).__name__}")
    if isinstance(want, dict):
        if list(got) != list(want):  # the same keys in another order were put in the example's (in_example_order)
            raise ValueError(f"compile_training: {where} has the keys {_keys(got)}, the example's {_keys(want)}")
        for k in want:
            _like(want[k], got[k], f"{where}[{k!r}]")
        return
    if len(got) != len(want):
        raise ValueError(f"compile_training: {where} holds {len(got)} items, the example's {len(want)}")
    for j, (w, g) in enumerate(zip(want, got)):
        _like(w, g, f"{where}[{j}]")


def takes_keywords(model: torch.nn.Module, inputs: tuple) -> bool:
    """A lone dict of inputs whose keys the forward's signature takes as keywords is passed as
    ``model(**batch)`` (a Hugging Face batch); any other dict is one positional argument."""
    if len(inputs) != 1 or not isinstance(inputs[0], dict) or not all(isinstance(k, str) for k in inputs[0]):
        return False
    try:
        inspect.signature(model.forward).bind(**inputs[0])
    except (TypeError, ValueError):
        return False
    return True


def _keys(mapping: Mapping) -> str:
    keys = list(mapping)
    return "(" + ", ".join(repr(k) for k in keys[:5]) + (", ..." if len(keys) > 5 else "") + ")"


def _where(items: tuple, path: tuple) -> str:
    if len(items) == 1 and isinstance(items[0], dict):
        return "batch" + pytree.keystr(path[1:])
    return f"batch item {path[0].idx}" + pytree.keystr(path[1:])
