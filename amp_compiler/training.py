"""``compile_training``: forward, backward and optimizer captured as graphs, in mixed precision.

``TrainStep`` keeps one captured, planned variant of the step per key (train_capture.py): batch
shapes, update or accumulate-only, the optimizer's state layout and baked hyper-parameters,
every submodule's train/eval mode. Parameters, optimizer state (kept in ``optimizer.state``, so the user's
``state_dict``/``load_state_dict`` work), scaler state and accumulated gradients are shared
by every variant; the number of variants is bounded by ``max_captures``. The shared passes
plan each graph: forward and backward GEMMs may go FP16, FP16 stops at the ``unscale_marker``
on each gradient (optimizer and master weights stay FP32), and the loss-scale arithmetic is
denied low precision by name (docs/architecture.md, "Training").
"""

from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch

from cost_model.runtime import default_runtime

from . import loss_scale as ls
from . import optim as fopt
from . import train_batch as tb
from .errors import ConversionError
from .fx_io.capture import views_as_reshapes
from .fx_io.flags import RESTLESS, FlagWatch
from .fx_io.mode import module_modes
from .fx_io.model_checks import HookWatch, SwapWatch, refuse_meta, warn_if_hooked, warn_if_low_precision
from .fx_io.operand_dtypes import check_operand_dtypes
from .fx_io.plans import largest_sizes, varying_dims
from .plan import make_context
from .train_capture import Setup, Variant, plan_variant, trace_variant
from .train_ddp import check_no_sync, sync_buffers
from .user_frame import user_stacklevel


@dataclass
class _Capture:
    runner: Callable
    variant: Variant
    graph_module: torch.fx.GraphModule
    report: Any
    report_nodes: dict[str, str]
    accepts: Callable[[list[torch.Tensor]], bool] | None = None  # a symbolic capture: the calls it takes


def _is_sign(value: Any) -> bool:
    """A hyper-parameter passed as a graph input, keyed by its sign (``optim.hyper_key``)."""
    return isinstance(value, tuple) and len(value) == 2 and value[0] == "sign"


def _family(key: tuple) -> tuple:
    """A capture key with its batch shapes reduced to ranks: the keys one symbolic capture may serve
    (a flush's, whose batch is ``None``, is its own). A key's batch is ``(tree, shapes)``: the batch's
    structure and constants (``train_batch.BatchTree``), its tensors' shapes and dtypes."""
    ranks = None if key[2] is None else (key[2][0], tuple((len(shape), dtype) for shape, dtype in key[2][1]))
    return (*key[:2], ranks, *key[3:])


def _shapes(key: tuple) -> tuple:
    """The batch tensors' shapes of a capture key (none for a flush's)."""
    return () if key[2] is None else tuple(shape for shape, _ in key[2][1])


class TrainStep:
    """``loss = step(*batch)``: one micro-batch (a dict batch: ``step(batch)`` or ``step(**batch)``); every
    ``accumulation_steps``-th call updates, and ``step.flush()`` applies an unfinished accumulation (the
    end of an epoch)."""

    def __init__(self, setup: Setup, example_batch: tuple, plan_options: dict[str, Any],
                 backend: str | None = None, max_captures: int = 8) -> None:
        self.setup, self.plan_options, self.backend, self.max_captures = setup, plan_options, backend, max_captures
        self.model, self.optimizer, self.config = setup.model, setup.optimizer, setup.config
        self._template = tb.template(example_batch, "the example batch")  # what every batch must be like
        self._params = dict(self.model.named_parameters())
        self._dtypes = {n: p.dtype for n, p in self._params.items()}
        self._buffers = dict(self.model.named_buffers())
        self._device = next(iter(self._params.values())).device if self._params else None
        self._scale = torch.tensor(self.config.init_scale, dtype=torch.float32, device=self._device)
        self._tracker = torch.zeros((), dtype=torch.float32, device=self._device)
        self._skipped = torch.zeros((), dtype=torch.int64, device=self._device)
        self._acc: list[torch.Tensor] = []
        self._micro = 0  # micro-batches accumulated since the last update
        self._captures: dict[tuple, _Capture] = {}
        self._taken: dict[tuple, _Capture] = {}  # keys a symbolic capture took (not captures of their own)
        self._static_only: set[tuple] = set()  # families whose symbolic trace failed
        self._warned_fp32 = False
        self._warned_hypers = False
        self._warned_grads = False
        self._warned_dynamo = False
        self.grad_norm: torch.Tensor | None = None  #: the last update's total gradient norm (clipping)
        self.report = self.graph_module = None
        self.report_nodes: dict[str, str] = {}
        self._hooks = HookWatch(self.model)  # hooks registered later are not in the captures: said
        self._flags = FlagWatch(self.model)  # Python flags the trace bakes in: part of the key (fx_io/flags.py)
        self._select(*tb.flatten(example_batch))
        self._swaps = SwapWatch(self.model)  # after the first capture, whose forward may set attributes

    # -- running --------------------------------------------------------------------------------
    def __call__(self, *batch: Any, **named: Any) -> torch.Tensor:
        if torch.compiler.is_compiling():  # torch.compile(step), or a compiled loop calling it
            return self._outside_dynamo(*batch, **named)
        return self._call(*batch, **named)

    @torch.compiler.disable
    def _outside_dynamo(self, *batch: Any, **named: Any) -> torch.Tensor:
        """The step called from code torch.compile traces: run as captured, outside dynamo, said once.
        Dynamo had traced into the capture and the planner and failed there (numpy on its fake values)."""
        if not getattr(self, "_warned_dynamo", False):  # (a step pickled before this flag)
            self._warned_dynamo = True
            warnings.warn("compile_training: the step was called inside torch.compile, which it is not traced by: it "
                          "runs its own captured graph as it is; pass backend=\"inductor\" to compile_training for "
                          "compiled kernels", stacklevel=user_stacklevel())
        return self._call(*batch, **named)

    def _call(self, *batch: Any, **named: Any) -> torch.Tensor:
        if named and batch:
            raise ValueError("compile_training: pass the step's batch positionally, step(*batch) or step(batch) "
                             "for a dict, or as keywords, step(**batch), not both")
        items = tb.in_example_order(self._template, tb.plain((named,) if named else batch))
        tb.check_like(self._template, items)  # before anything runs or changes
        batch, tree = tb.flatten(items)
        self._hooks.check("compile_training", stacklevel=3, fix="compute what it collects in loss_fn")
        check_no_sync(self.setup.ddp, self._micro + 1, self.setup.accumulation_steps)
        fopt.refuse_step_hooks(self.optimizer)  # one registered after compile_training would never run
        self._check_not_replaced()
        n_captures = len(self._captures)
        cap = self._select(batch, tree)
        if len(self._captures) != n_captures:  # a capture runs the forward's Python, which may set attributes
            self._swaps.reset()
        v = cap.variant
        sync_buffers(self.setup.ddp)
        flat = self._flat_inputs(batch, v)
        outputs = list(cap.runner(*flat))
        loss = outputs[0]
        if not v.update:
            self._acc, self._micro = outputs[1:], self._micro + 1
            return loss
        self._apply(outputs[1:], v)
        self._acc, self._micro = [], 0
        return loss

    @property
    def pending(self) -> int:
        """Micro-batches accumulated since the last update, not applied yet (``flush()`` applies them)."""
        return self._micro

    @torch.compiler.disable  # as __call__, called from code torch.compile traces
    def flush(self, apply: bool = True) -> bool:
        """Apply the gradients of an unfinished accumulation now: the end of an epoch whose micro-batch count
        is not a multiple of ``accumulation_steps``. Without it they stay accumulated and the next call's
        update adds them to the next micro-batches' (an epoch's last micro-batches counted in the next
        epoch's first update), and ``zero_grad()`` cannot drop them.

        As eager accumulation of ``loss / N`` does when it steps at the end of the epoch, each pending
        micro-batch counts 1/N (``accumulation_steps``), not 1/pending; the update is otherwise a normal one
        (unscaling, overflow skip, clipping, the optimizer, the scale's growth). One more capture, the
        first time (no forward: the update alone); ``step.report`` stays the last micro-batch's. Returns
        whether anything was pending; call it on every rank under DDP (the update all-reduces).
        ``apply=False`` drops them instead (as ``drop_last`` would have)."""
        if not self._micro:
            return False
        if not apply:
            self._acc, self._micro = [], 0
            return True
        check_no_sync(self.setup.ddp, self.setup.accumulation_steps, self.setup.accumulation_steps)
        fopt.refuse_step_hooks(self.optimizer)
        self._check_not_replaced()
        cap = self._select_flush()
        outputs = list(cap.runner(*self._flat_inputs((), cap.variant)))
        self._apply(outputs[1:], cap.variant)
        self._acc, self._micro = [], 0
        return True

    def _select_flush(self) -> _Capture:
        """The flushing variant: the update from the accumulated gradients, no batch and no forward (so the
        model's modes and flags are not in its key; ``None`` batch shapes tell it from every micro-batch's)."""
        if tuple(n for n, p in self._params.items() if p.requires_grad) != self.setup.trainable_order:
            self._follow_trainable()  # raises: pending micro-batches
        states = self._states()
        key = (True, True, None, fopt.state_layout(states).signature(), fopt.hyper_key(self.optimizer), None,
               self.setup.trainable_order, ())
        cap = self._captures.get(key)
        if cap is None:
            cap = self._capture(key, Variant(True, True, 0, flush=True), states, ())
        return cap

    def _check_not_replaced(self) -> None:
        """Refuse a step after a parameter, buffer or submodule was replaced (``layer.weight =
        nn.Parameter(...)``): the step reads and updates the tensors it was compiled with, as does the
        optimizer, so the model's new tensor had silently never trained (``model_checks.SwapWatch``)."""
        watch = getattr(self, "_swaps", None)  # (a step pickled before the watch)
        replaced = watch.swapped() if watch is not None else ""
        if replaced:
            raise ValueError(f"compile_training: {replaced} was replaced after compile_training; the step and the "
                             f"optimizer hold the tensors it was compiled with, so the model's new one would never "
                             f"train: copy new values in place (with torch.no_grad(): p.copy_(new), or "
                             f"model.load_state_dict), or make the optimizer and call compile_training again")

    def _apply(self, outputs: list[torch.Tensor], v: Variant) -> None:
        n_p = len(self.setup.trainable)
        n_s = sum(len(k) for k in v.state_out.keys)
        new_p, new_s = outputs[:n_p], outputs[n_p:n_p + n_s]
        scale, tracker, overflow, norm = outputs[n_p + n_s:n_p + n_s + 4]
        grads = outputs[n_p + n_s + 4:]
        with torch.no_grad():
            for name, value in zip(self.setup.trainable, new_p):
                self._params[name].copy_(value)
        created = v.state_out.signature() != v.state_in.signature()
        if not created or not bool(overflow):  # a skipped first step leaves the state uncreated
            self._store_state(v.state_out, new_s)
        self._scale, self._tracker, self.grad_norm = scale, tracker, norm
        self._skipped = self._skipped + overflow.to(torch.int64)
        if self.setup.keep_grads:
            for name, g in zip(self.setup.trainable, grads):
                self._params[name].grad = g
        else:
            self._clear_outside_grads()
        self.optimizer._opt_called = True  # schedulers: optimizer.step() did run  # noqa: SLF001

    def _clear_outside_grads(self) -> None:
        """Without ``keep_grads`` the step's gradients never reach ``p.grad``: one left there by an eager
        backward had been what ``clip_grad_norm_`` after the step clipped and measured, unrelated to the
        update the step already applied. It is cleared (said once), so ``p.grad`` is ``None`` after a step."""
        stale = [n for n in self.setup.trainable if self._params[n].grad is not None]
        if not stale:
            return
        for name in stale:
            self._params[name].grad = None
        if not getattr(self, "_warned_grads", False):  # (a step pickled before this flag)
            self._warned_grads = True
            warnings.warn(f"compile_training: {stale[0]}.grad held a gradient from outside the step (an eager "
                          f"backward); the step computes and applies its own, so it is cleared: "
                          f"clip_grad_norm_ after the step clips nothing, pass max_grad_norm= (or max_grad_value=) "
                          f"to compile_training, and keep_grads=True to read the step's gradients",
                          stacklevel=user_stacklevel())

    def _store_state(self, layout: fopt.StateLayout, tensors: list[torch.Tensor]) -> None:
        it = iter(tensors)
        for name, keys, consts in zip(self.setup.trainable, layout.keys, layout.constants):
            state = self.optimizer.state[self._params[name]]
            state.update(consts)
            state.update({k: next(it) for k in keys})

    def _states(self) -> list[dict[str, Any]]:
        return [dict(self.optimizer.state.get(self._params[n], {})) for n in self.setup.trainable]

    def _flat_inputs(self, batch, v: Variant) -> list[torch.Tensor]:
        states = self._states()
        return [*(self._params[n].detach() for n in self.setup.trainable),
                *(self._params[n].detach() for n in self.setup.frozen),
                *(self._buffers[n] for n in self.setup.buffers),
                *(s[k] for s, keys in zip(states, v.state_in.keys) for k in keys),
                *fopt.hyper_tensors(self.optimizer, self._device), self._scale, self._tracker,
                *(self._acc if v.has_acc else []), *batch]

    # -- captures -------------------------------------------------------------------------------
    def _select(self, batch: list[torch.Tensor], tree: tb.BatchTree) -> _Capture:
        moved = next((n for n, p in self._params.items() if p.dtype != self._dtypes[n]), None)
        if moved is not None:  # it had failed inside the graph ('mat1 and mat2 must have the same dtype')
            raise ValueError(f"compile_training: parameter {moved} is {self._params[moved].dtype} now, "
                             f"{self._dtypes[moved]} when compiled (model.half() after compile_training?): the step "
                             f"keeps FP32 master weights and runs FP16 where it pays; call model.float()")
        if tuple(n for n, p in self._params.items() if p.requires_grad) != self.setup.trainable_order:
            self._follow_trainable()
        n_acc = self.setup.accumulation_steps
        update = self._micro + 1 >= n_acc
        has_acc = self._micro > 0
        states = self._states() if update else []
        key = (update, has_acc, (tree, tuple((tuple(t.shape), t.dtype) for t in batch)),
               fopt.state_layout(states).signature() if update else None,
               fopt.hyper_key(self.optimizer) if update else None, module_modes(self.model),
               tuple(n for n, p in self._params.items() if p.requires_grad), self._flags.values())
        cap = self._captures.get(key) or self._taken.get(key) or self._symbolic_taking(key, batch)
        if cap is None and self._flag_changed(key):
            return self._select(batch, tree)  # a counter was dropped from the watch: keyed again
        if cap is None:
            cap = self._capture(key, Variant(update, has_acc, len(batch), tree=tree), states, batch)
            after = self._flags.values()
            if after != key[-1]:  # the traced forward wrote them: state, not flags
                self._rekey(self._flags.forget(key[-1], after))
        self.report, self.graph_module, self.report_nodes = cap.report, cap.graph_module, cap.report_nodes
        return cap

    def _flag_changed(self, key: tuple) -> bool:
        """Warn that a Python flag changed since a capture that differs only by it (it is captured again),
        or, when its changes made ``RESTLESS`` captures, drop it from the watch (True: key again)."""
        old = next((k[-1] for k in self._captures if k[:-1] == key[:-1]), None)
        if old is None:
            return False
        restless = self._flags.restless(old, key[-1])
        if restless:
            names = ", ".join(self._flags.slots[i][2] for i in restless)
            self._rekey(self._flags.drop(set(restless)))
            warnings.warn(f"compile_training: {names} changed between steps {RESTLESS} times: taken as state, not "
                          f"a flag, so its changes no longer capture again (the step keeps the value it was captured "
                          f"with; a value that varies by step belongs in a tensor buffer, which the step reads)",
                          stacklevel=user_stacklevel())
            return True
        warnings.warn(f"compile_training: {self._flags.describe(old, key[-1])} since the step was captured, which "
                      f"baked the old value in: captured again for the new one", stacklevel=user_stacklevel())
        return False

    def _rekey(self, drop: Callable[[tuple], tuple]) -> None:
        """Re-key the captures after the flags watch dropped attributes (``drop`` removes them from a key)."""
        def again(k: tuple) -> tuple:
            return (*k[:-1], drop(k[-1]))
        self._captures = {again(k): c for k, c in self._captures.items()}
        self._taken = {again(k): c for k, c in self._taken.items()}
        self._static_only = {again(f) for f in self._static_only}

    def _symbolic_taking(self, key: tuple, batch: tuple) -> _Capture | None:
        """A symbolic capture of the key's family whose guards take the batch (remembered for the key)."""
        family = _family(key)
        for k, cap in self._captures.items():
            if cap.accepts is not None and _family(k) == family and cap.accepts(self._flat_inputs(batch, cap.variant)):
                self._taken[key] = cap
                return cap
        return None

    def _follow_trainable(self) -> None:
        """Parameters were frozen or unfrozen (a backbone unfrozen at epoch 2): the step's inputs change,
        so the captures are dropped and the next call captures again; scale and optimizer state stay."""
        if self._micro:
            raise ValueError("compile_training: which parameters require grad changed between micro-batches "
                             "of one accumulation; change it after an update (step.flush() applies the "
                             "micro-batches accumulated so far)")
        old = self.setup
        model = old.ddp if old.ddp is not None else old.model
        self.setup = _setup(model, old.loss_fn, old.optimizer, old.config, old.n_targets, old.accumulation_steps,
                            old.max_grad_norm, old.keep_grads, old.max_grad_value)
        self._captures.clear()
        self._taken.clear()
        warnings.warn(f"compile_training: the parameters that require grad changed ({len(self.setup.trainable)} "
                      f"trainable, {len(self.setup.frozen)} frozen now): the step is captured again",
                      stacklevel=user_stacklevel())

    def _capture(self, key: tuple, variant: Variant, states, batch) -> _Capture:
        if len(self._captures) >= self.max_captures:
            raise ConversionError("compile_training", *self._why_new_capture(key, batch))
        family = _family(key)
        seen = [_shapes(k) for k in (*self._captures, *self._taken) if _family(k) == family] \
            if not variant.flush else []
        shapes = tuple(tuple(t.shape) for t in batch)
        # dims that took another size are traced symbolic, unless that failed for this kind before
        dynamic = {} if family in self._static_only or variant.flush else varying_dims(seen, shapes)
        new_shape = bool(self._captures) and all(k[2] != key[2] for k in self._captures) and not variant.flush
        acc = [torch.zeros_like(self._params[n], dtype=torch.float32) for n in self.setup.trainable] \
            if variant.has_acc else []
        try:
            traced = trace_variant(self.setup, variant, states, self._scale, self._tracker, acc, batch, dynamic)
        except ConversionError:
            if not dynamic:
                raise
            # the symbolic trace failed (a model that branches on those sizes): static captures, as before
            self._static_only.add(family)
            traced = trace_variant(self.setup, variant, states, self._scale, self._tracker, acc, batch)
        # fake tensors ran what the real kernels refuse (a float64 batch for a float32 model)
        check_operand_dtypes(traced.gm, "compile_training", self.model.parameters(), "batch inputs")
        changed = self._changed_hypers(key)
        sign_only = all(name.endswith(" (sign)") for name in changed)  # a few captures at most: said each time
        if changed and (sign_only or not self._warned_hypers):  # once: a scheduler cycling them re-captures every step
            self._warned_hypers = self._warned_hypers or not sign_only
            warnings.warn(f"compile_training: capturing step variant {len(self._captures) + 1}: "
                          f"{self._hyper_advice(changed)}", stacklevel=user_stacklevel())
        if new_shape:
            symbolic = (f"; batch dims {sorted(traced.symbols)} traced symbolic, so later sizes reuse it"
                        if traced.symbols else "")
            warnings.warn(f"compile_training: capturing step variant {len(self._captures) + 1} "
                          f"({self._what_batch(key, batch)}, "
                          f"{'update' if variant.update else 'accumulate'}{symbolic})",
                          stacklevel=user_stacklevel())
        gm = traced.gm
        # a symbolic step is sized by the largest size each batch dim took (as the export route's plans)
        hints = largest_sizes(traced.symbols, (*seen, shapes))
        report, nodes, folded = plan_variant(self.setup, gm, variant, self.plan_options, hints)
        runner = gm
        if self.backend == "inductor":
            runner = torch.compile(views_as_reshapes(gm), backend="inductor", dynamic=bool(traced.symbols) or None)
        if folded.entries:
            runner = _Refreshing(runner, gm, folded)
        cap = self._captures[key] = _Capture(runner, variant, gm, report, nodes, traced.accepts)
        if not variant.flush:  # the update alone is FP32 by design
            self._warn_if_fp32(report)
        return cap

    def _changed_hypers(self, key: tuple) -> list[str]:
        """The optimizer hyper-parameters (graph constants, or the sign of an input one) that alone tell
        ``key`` from a capture's; a sign's change is named ``"name (sign)"``."""
        for k in self._captures:
            if k[:4] == key[:4] and k[5:] == key[5:] and k[4] != key[4] and k[4] is not None:
                return sorted({name + (" (sign)" if _is_sign(a) and _is_sign(b) else "")
                               for old, new in zip(k[4], key[4]) for (name, a), (_, b) in zip(old, new) if a != b})
        return []

    def _hyper_advice(self, changed: list[str]) -> str:
        """Why ``changed`` hyper-parameters capture again, and the fix for each: a scheduler cycling
        ``momentum`` takes ``cycle_momentum=False``; any other (a weight-decay schedule) had been given
        that same advice, which changes nothing for it. A graph-input one (``optim._SIGNED``) captures
        again only when it reaches or leaves 0 (the optimizer takes another branch)."""
        signs = [name.split()[0] for name in changed if name.endswith(" (sign)")]
        changed = [name for name in changed if not name.endswith(" (sign)")]
        if not changed:
            return (f"optimizer {type(self.optimizer).__name__}'s {', '.join(signs)} reached or left 0 since a "
                    f"capture, where the optimizer takes another branch: captured again for that branch (its "
                    f"other values are graph inputs and capture nothing)")
        fixes = []
        if "momentum" in changed:
            fixes.append("if a scheduler cycles momentum (OneCycleLR, CyclicLR), pass it cycle_momentum=False")
        others = [name for name in changed if name != "momentum"]
        if others:
            fixes.append(f"keep {', '.join(others)} constant or change {'them' if len(others) > 1 else 'it'} "
                         f"rarely (a schedule setting a new value at every step captures at every step)")
        return (f"optimizer {type(self.optimizer).__name__}'s hyper-parameters {changed} changed since a capture "
                f"(each value is a constant of the graph: the optimizer branches on it in Python): "
                f"{'; '.join(fixes)}")

    def _why_new_capture(self, key: tuple, batch: tuple) -> tuple[str, str]:
        """``(where, reason)`` of the error when ``key`` would be one capture too many: the optimizer's
        baked hyper-parameters if only they differ from a capture's (a scheduler cycling momentum), else
        the batch shapes."""
        limit = f"would be capture {len(self._captures) + 1} of at most max_captures={self.max_captures}"
        changed = self._changed_hypers(key)
        if changed:
            return (f"optimizer {type(self.optimizer).__name__}",
                    f"{limit}: {self._hyper_advice(changed)}, or raise max_captures")
        if key[2] is None:
            return ("step.flush()", f"{limit} (the update alone, captured on the first flush): raise max_captures")
        what = self._what_batch(key, batch)
        fix = "pad or bucket the shapes" if what.startswith("batch shapes") else "keep them constant"
        return what, f"{limit}: {fix}, or raise max_captures"

    def _what_batch(self, key: tuple, batch: list[torch.Tensor]) -> str:
        """What is new about a batch: its constants (a bool or int leaf, ``train_batch.py``) when a capture
        has its shapes, else its shapes."""
        tree, shapes = key[2]
        other = next((k[2][0] for k in self._captures if k[2] is not None and k[2][1] == shapes), None)
        changed = tree.changed_constants(other) if other is not None else ""
        return f"batch constants {changed}" if changed else f"batch shapes {[tuple(t.shape) for t in batch]}"

    def _warn_if_fp32(self, report) -> None:
        summary = report.summary
        if self._warned_fp32 or summary.get("fp16_nodes", 1) or self.plan_options.get("planner") != "optimal":
            return
        self._warned_fp32 = True
        change = ('backend="inductor" (casts fuse), ' if self.plan_options["runtime"] == "eager" else "") + \
            ('objective="memory", ' if self.plan_options["objective"] == "time" else "")
        warnings.warn(f"compile_training: the plan runs the whole step in FP32: on {self.plan_options['target']} "
                      f"the cost model finds this model's ops too small for low precision to pay for its casts "
                      f"(launch-bound, {self.plan_options['runtime']} runtime); would change it: {change}or "
                      f"planner='greedy' (forces the GEMMs to FP16); the numbers are in "
                      f"step.report.summary['fp32_tensor_core_why']", stacklevel=user_stacklevel())

    @property
    def captures(self) -> list[dict[str, Any]]:
        """One row per captured variant: batch shapes, whether it updates, and whether it is ``flush()``'s
        (no batch), bounded by max_captures."""
        return [{"update": k[0], "accumulated": k[1], "batch_shapes": list(_shapes(k)),
                 "flush": k[2] is None} for k in self._captures]

    # -- state ------------------------------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        """``torch.save(step)``: model, optimizer, scaler state and options, not the captures (graphs and
        shape-guard closures of this process, which had failed to pickle): the loaded step captures again."""
        return {**self.__dict__, "_captures": {}, "_taken": {}, "report": None, "graph_module": None,
                "report_nodes": {}}

    @property
    def scale(self) -> float:
        """The current loss scale (reading it synchronises; the step itself never does)."""
        return float(self._scale)

    @property
    def skipped_steps(self) -> int:
        return int(self._skipped)

    def grads(self) -> dict[str, torch.Tensor]:
        """The last update's unscaled (and clipped) gradients by parameter name (``keep_grads=True``)."""
        if not self.setup.keep_grads:
            raise ValueError("compile_training: gradients are kept only with keep_grads=True (to clip them, "
                             "pass max_grad_norm=: the step applies the update itself)")
        return {n: self._params[n].grad for n in self.setup.trainable if self._params[n].grad is not None}

    def state_dict(self) -> dict[str, Any]:
        """The scaler's state (the optimizer's own state is in ``optimizer.state_dict()``). Gradients of an
        unfinished accumulation are not in it (said): ``flush()`` first."""
        if self._micro:
            warnings.warn(f"compile_training: step.state_dict() with {self._micro} micro-batch(es) accumulated and "
                          f"not applied (accumulation_steps={self.setup.accumulation_steps}): their gradients are "
                          f"not saved; call step.flush() before saving to apply them", stacklevel=user_stacklevel())
        return {"scale": self._scale.clone(), "growth_tracker": self._tracker.clone(),
                "skipped_steps": self._skipped.clone(), "loss_scale": self.config.mode}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load ``state_dict()``'s, or a ``torch.amp.GradScaler``'s (an eager autocast run resumed here:
        its ``_growth_tracker``, no skip count); onto this step's device (a checkpoint mapped to the CPU)."""
        if "_growth_tracker" in state and "growth_tracker" not in state:  # GradScaler.state_dict()
            state = {"skipped_steps": 0, **state, "growth_tracker": state["_growth_tracker"]}
        missing = {"scale", "growth_tracker", "skipped_steps"} - set(state)
        if missing:
            raise KeyError(f"compile_training: the scaler state_dict lacks {sorted(missing)}")
        self._scale, self._tracker, self._skipped = (
            torch.as_tensor(state[k]).to(like.device, like.dtype, copy=True)
            for k, like in (("scale", self._scale), ("growth_tracker", self._tracker), ("skipped_steps", self._skipped)))


@dataclass
class _Refreshing:
    """``runner`` recasting first the FP16 copies of frozen parameters whose FP32 input changed (a
    ``load_state_dict`` when resuming: the copies made at capture had trained on stale weights); a
    class, not a closure, so ``torch.save(step)`` pickles it."""

    runner: Callable
    gm: torch.fx.GraphModule
    folded: Any

    def __call__(self, *flat: torch.Tensor):
        self.folded.refresh(self.gm, flat)
        return self.runner(*flat)


def _uncompiled(model: torch.nn.Module) -> torch.nn.Module:
    """The module a ``torch.compile(model)`` wraps (its ``OptimizedModule``), else ``model``: the step traces
    the module itself (make_fx had traced into inductor's kernels: 'Cannot access data pointer of Tensor')."""
    dynamo = sys.modules.get("torch._dynamo.eval_frame")  # not imported: nothing was torch.compile'd
    compiled = getattr(dynamo, "OptimizedModule", None)
    return model._orig_mod if compiled is not None and isinstance(model, compiled) else model  # noqa: SLF001


def _warn_if_compiled(model: torch.nn.Module) -> None:
    """Say that a ``torch.compile``'d model (or one inside DDP) is trained through its original module, and
    what compiles the step's kernels instead."""
    inner = getattr(_uncompiled(model), "module", None)
    if _uncompiled(model) is model and (inner is None or _uncompiled(inner) is inner):
        return
    warnings.warn("compile_training: the model is a torch.compile'd module; the step captures its original module "
                  "itself (forward, backward and optimizer in one graph), so torch.compile's wrapper is not used: "
                  "pass backend=\"inductor\" to compile_training for compiled kernels", stacklevel=user_stacklevel())


def _setup(model, loss_fn, optimizer, config, n_targets, accumulation_steps, max_grad_norm, keep_grads,
           max_grad_value=None) -> Setup:
    """Validate the model/optimizer pair and fix the parameter order (the optimizer's groups)."""
    from .train_ddp import unwrap

    wrapper = _uncompiled(model)  # torch.compile(DDP(model)) or DDP(torch.compile(model)): the module itself
    model, all_reduce = unwrap(wrapper)
    model = _uncompiled(model)
    fopt.check(optimizer)
    if not isinstance(accumulation_steps, int) or accumulation_steps < 1:
        raise ValueError(f"compile_training: accumulation_steps must be an integer >= 1, got {accumulation_steps!r}")
    for name, bound in (("max_grad_norm", max_grad_norm), ("max_grad_value", max_grad_value)):
        if bound is not None and not bound > 0:
            raise ValueError(f"compile_training: {name} must be > 0, got {bound!r}")
    _check_sparse(model)
    params = dict(model.named_parameters())
    name_of = {id(p): n for n, p in params.items()}
    buffer_of = {id(b): n for n, b in model.named_buffers()}
    trainable, sizes = [], []
    for group in optimizer.param_groups:
        names = [name_of.get(id(p)) for p in group["params"] if p.requires_grad]
        if None in names:
            stray = next(p for p in group["params"] if p.requires_grad and id(p) not in name_of)
            if id(stray) in buffer_of:  # register_buffer(...) + requires_grad_(): a parameter in disguise
                raise ConversionError("compile_training", "optimizer", f"holds the model's buffer "
                                      f"{buffer_of[id(stray)]!r}, which requires grad: the step trains parameters; "
                                      f"make it one (nn.Parameter instead of register_buffer)")
            raise ConversionError("compile_training", "optimizer", "holds a parameter that is not the model's")
        trainable += names
        sizes.append(len(names))
    missing = [n for n, p in params.items() if p.requires_grad and n not in trainable]
    if missing:
        raise ConversionError("compile_training", f"parameter {missing[0]}", "is not in the optimizer's param_groups")
    frozen = [n for n, p in params.items() if not p.requires_grad]
    return Setup(model, loss_fn, optimizer, config, trainable, frozen, [n for n, _ in model.named_buffers()],
                 sizes, n_targets, accumulation_steps, max_grad_norm, keep_grads, all_reduce,
                 tuple(n for n, p in params.items() if p.requires_grad), max_grad_value,
                 wrapper if all_reduce is not None else None)


def _check_sparse(model: torch.nn.Module) -> None:
    """Refuse a trainable ``nn.Embedding``/``nn.EmbeddingBag(sparse=True)``: its gradient is sparse, and
    the captured step's are dense tensors (tracing one failed inside aten, on the SparseCPU backend).
    Reads parameters, never ``module.weight``: a parametrized one (``spectral_norm``) is computed on
    each read, and its power iteration had updated the model's buffers at compile time."""
    for name, module in model.named_modules():
        if getattr(module, "sparse", False) is True and any(p.requires_grad for p in module.parameters()):
            raise ConversionError("compile_training", f"module {name}", f"{type(module).__name__}(sparse=True) makes "
                                  "sparse gradients, which the captured step does not hold: use sparse=False "
                                  "(dense gradients, with any optimizer but SparseAdam)")


def compile_training(model: torch.nn.Module, loss_fn: Callable, optimizer: torch.optim.Optimizer,
                     example_batch: tuple, *, loss_scale: Any = "dynamic", target: str = "h100",
                     dtype: torch.dtype | str = torch.float16, backend: str | None = None,
                     planner: str = "optimal", allow=(), deny=(), deny_nodes=(), n_targets: int | None = None,
                     init_scale: float = 2.0 ** 16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
                     growth_interval: int = 2000, deny_propagation: bool = True,
                     accumulation_steps: int = 1, max_grad_norm: float | None = None, keep_grads: bool = False,
                     max_captures: int = 8, max_grad_value: float | None = None, deploy: str | None = None,
                     objective: str = "time") -> TrainStep:
    """A captured, mixed-precision training step: ``loss = step(*batch)``.

    ``batch`` is the model's inputs followed by ``n_targets`` targets (default 1); the loss is
    ``loss_fn(model(*inputs), *targets)`` (a scalar), returned detached: the step has run the backward
    and the update (an eager loop's ``loss.backward()`` and ``optimizer.step()`` go). A batch item may
    be a dict, list or tuple of tensors (nested; None/bool/int/float/str leaves are constants of the
    capture). A dict batch (a Hugging Face collator's) is the model's keyword inputs:
    ``loss_fn(model(**batch))``, with ``n_targets=0`` by default, e.g. ``loss_fn=lambda out: out.loss``
    and ``step(batch)``; a lone dict whose keys the forward does not take is passed as one argument.
    ``optimizer`` is any ``torch.optim`` optimizer but LBFGS/SparseAdam/Adafactor; its own update is
    traced, its lr read at every step and its state kept in ``optimizer.state``. ``model`` may be
    wrapped in DistributedDataParallel.
    Parameters with ``requires_grad=False`` are frozen. ``loss_scale`` is ``"dynamic"``
    (torch.amp's defaults), a number (constant scale) or ``"none"``. ``accumulation_steps=N``:
    each call is a micro-batch of the loss divided by N, the N-th call updates; ``step.flush()`` applies
    the micro-batches of an unfinished accumulation (the end of an epoch), ``step.pending`` counts them.
    ``max_grad_norm`` clips the unscaled gradients (``clip_grad_norm_``), ``max_grad_value`` clamps
    them first: the step applies the update itself, so ``clip_grad_norm_``/``clip_grad_value_`` called
    after it clip nothing (``p.grad`` is ``None`` after a step; a gradient an eager backward left there
    is cleared, with a warning). An inf/NaN gradient skips the step and backs the loss scale off, with
    or without clipping. ``keep_grads`` writes the (clipped) gradients to ``p.grad``. Batch shapes may change: a dim seen at a second size is traced symbolic
    and that capture serves its later sizes; captures are at most ``max_captures``.
    ``step.report`` is the per-op report of the last graph run. ``deploy`` names the runtime profile
    the cost model prices (default: ``inductor`` with ``backend="inductor"``, which fuses casts into
    their neighbours, else ``eager``), ``objective`` ``"time"``, ``"memory"`` or ``"fastest"``, as for
    ``compile``.
    """
    if backend not in (None, "inductor"):
        raise ValueError(f"unknown backend {backend!r}: use None or 'inductor'")
    config = ls.LossScaleConfig.parse(loss_scale) if loss_scale in (None, "none") else \
        ls.LossScaleConfig.parse(loss_scale, growth_factor=growth_factor, backoff_factor=backoff_factor,
                                 growth_interval=growth_interval)
    if config.mode == "dynamic":
        config = ls.LossScaleConfig("dynamic", init_scale, growth_factor, backoff_factor, growth_interval)
    if isinstance(example_batch, torch.Tensor):  # tuple() would split it into its rows: a silent misuse
        raise ValueError(f"compile_training: the example batch is one tensor of shape {tuple(example_batch.shape)}; "
                         "the step takes a tuple of the model's inputs then its targets, e.g. (x, y), or (x,) with "
                         "n_targets=0 where the loss reads the output alone")
    example_batch = tb.plain((example_batch,) if isinstance(example_batch, Mapping) else tuple(example_batch))
    tb.template(example_batch, "the example batch")  # a leaf neither a tensor nor a constant: refused first
    if n_targets is None:  # a lone dict holds the labels the model computes its loss from (model(**batch).loss)
        n_targets = 0 if len(example_batch) == 1 and isinstance(example_batch[0], dict) else 1
    if not isinstance(n_targets, int) or not 0 <= n_targets < max(len(example_batch), 1):
        raise ValueError(f"compile_training: n_targets={n_targets!r} with an example batch of {len(example_batch)} "
                         f"item(s): the batch is the model's inputs, then n_targets targets for loss_fn (none "
                         f"for a dict batch whose labels the model takes: n_targets=0)")
    _warn_if_compiled(model)
    setup = _setup(model, loss_fn, optimizer, config, n_targets, accumulation_steps, max_grad_norm, keep_grads,
                   max_grad_value)
    refuse_meta(setup.model, example_batch, "compile_training")
    warn_if_low_precision(setup.model, "compile_training")
    warn_if_hooked(setup.model, "compile_training")
    plan_options = dict(target=target, dtype=dtype, planner=planner, allow=allow, deny=deny, deny_nodes=deny_nodes,
                        deny_propagation=deny_propagation, objective=objective,
                        runtime=deploy or default_runtime("torch", backend))
    make_context(**{**plan_options, "dtype": str(dtype), "deny_nodes": ()})  # bad options fail before tracing
    return TrainStep(setup, example_batch, plan_options, backend, max_captures)
