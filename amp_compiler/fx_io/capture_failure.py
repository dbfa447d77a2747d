"""When torch.export cannot capture a model: the dynamo route's first call, or the one error that
names module, line, construct and what to try next (docs/architecture.md, "Capture routes and shapes")."""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Iterator

import torch

from ..errors import ConversionError
from .capture import failing_module, raising_line
from .model_checks import scripted_submodule
from .operand_dtypes import OperandDtypeError
from ..rule_names import RuleNameError
from .plans import Plan


def grad_mode(training: bool):
    return contextlib.nullcontext() if training else torch.no_grad()


#: loggers that print a whole traceback per failed op while dynamo traces a call that cannot run (an
#: example of the wrong shape: 282 lines of ``fake_tensor`` errors before our one line)
_TRACING_LOGGERS = ("torch._subclasses.fake_tensor", "torch._dynamo", "torch._inductor")


@contextlib.contextmanager
def tracing_quiet() -> Iterator[None]:
    """A capture (the example call's, a later call's, a training step's trace) without torch's own error
    logs: a failure becomes one error, ours or the model's (torch's traceback stays on a chained
    exception); planned calls log as torch does."""
    loggers = [logging.getLogger(name) for name in _TRACING_LOGGERS]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def dynamo_or_raise(route: Any, model: torch.nn.Module, args: tuple, kwargs: dict,
                     export_error: ConversionError, training: bool) -> tuple[Plan, tuple]:
    """The dynamo route's plan of the example call and ``(output,)`` (run once to compile), or one error
    naming module and construct."""
    try:
        with grad_mode(training), tracing_quiet():
            plan, out = route.call(args, kwargs, own_errors=False)
        if plan.report is not None:
            return plan, (out,)
        dynamo = "dynamo captured no graph (every op would run eagerly in FP32)"
    except Exception as exc:  # noqa: BLE001 - both routes failed: one readable error
        refused = _refusal(exc)
        if refused is not None:  # the example or the options, not the construct, are what to fix
            raise type(refused)(route.source, refused.where, refused.reason) from None
        _raise_if_eager_fails(route.source, model, args, kwargs, training)
        inner = exc
        while inner.__cause__ is not None and not isinstance(inner, ConversionError):
            inner = inner.__cause__
        dynamo = f"torch.compile failed too ({inner.reason if isinstance(inner, ConversionError) else inner})"
    module = failing_module(export_error, model)
    where = f"module {module}" if module else "the top-level forward"
    scripted = scripted_submodule(model)
    fix = (f"submodule {scripted} is torch.jit.script-ed, which neither route traces into: compile the model "
           f"before scripting it") if scripted else (
        "make that construct traceable (torch.where/torch.cond for a branch on values, a pytree registration "
        "for a custom output type)")
    error = ConversionError(route.source, f"{where}, {export_error.where}", f"{export_error.reason}; {dynamo}; next: "
                            f"{fix}, or compile the submodules that trace (amp_compiler.compile(model.<submodule>, "
                            f"...))")
    error.__context__ = export_error  # torch's tracebacks, for a debugger, not printed: one line uncaught too
    raise error from None


def eager_error(model: torch.nn.Module, args: tuple, kwargs: dict) -> Exception | None:
    """The exception ``model`` raises called eagerly with ``args``/``kwargs`` (in the caller's grad
    mode), or None: run only once a capture of that call failed, to tell the model's own error apart."""
    try:
        with torch.compiler.set_stance("force_eager"):
            model(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - returned to the caller, which raises it or says it
        return exc
    return None


def _raise_if_eager_fails(source: str, model: torch.nn.Module, args: tuple, kwargs: dict, training: bool) -> None:
    """A ``ConversionError`` when the model itself fails on the call both routes could not capture (an
    example of the wrong shape, a config whose head counts do not divide): the call, not a construct
    to make traceable, is what to fix. Run once, eagerly, only once both captures failed."""
    with grad_mode(training):
        exc = eager_error(model, args, kwargs)
    if exc is not None:
        module = failing_module(exc, model)
        where = ", ".join(part for part in (f"module {module}" if module else "", raising_line(exc)) if part)
        first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
        error = ConversionError(source, where or "forward",
                                f"the model fails on this call in eager PyTorch too ({type(exc).__name__}: "
                                f"{first[:300]}): the call, not its capture, is what to fix: pass inputs the "
                                f"model runs on (compile(model, (x,), example_kwargs={{...}}) takes what the model is "
                                f"called with)")
        error.__context__ = exc  # the model's traceback, for a debugger
        raise error from None


def _refusal(exc: BaseException | None) -> OperandDtypeError | RuleNameError | None:
    """The ``OperandDtypeError`` or ``RuleNameError`` our backend raised under ``exc`` (dynamo wraps it:
    ``inner_exception``): the other route would refuse the same."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, (OperandDtypeError, RuleNameError)):
            return exc
        seen.add(id(exc))
        exc = getattr(exc, "inner_exception", None) or exc.__cause__ or exc.__context__
    return None


__all__ = ["dynamo_or_raise", "eager_error", "grad_mode", "tracing_quiet"]
