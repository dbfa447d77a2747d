"""What a PyTorch user's set-up gets: the why-lines count casts at parameters apart from the graph's
inputs and outputs (``passes/explain.py``), a wrapper made after ``.eval()`` is planned for
inference (``fx_io/mode.py``), and a size argument of the wrong kind is named."""

from __future__ import annotations

import re
import warnings

import pytest
import torch

import amp_compiler
from amp_compiler.errors import ConversionError


def test_parameters_cast_every_call_are_named_as_such():
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    x = torch.randn(4, 64)
    why = amp_compiler.compile(mlp.train(), x).report.summary["fp32_tensor_core_why"]
    assert "its casts: 4 at parameters cast every call (training mode keeps their FP32 master copy), " \
           "2 at graph inputs/outputs" in why, why
    # eval mode folds the weights' casts: FP16 (a near tie of launches), nothing to explain
    assert not amp_compiler.compile(mlp.eval(), x).report.summary["fp32_tensor_core_why"]


def test_a_wrapper_made_after_eval_plans_for_inference():
    """``nn.DataParallel(model.eval())`` (or a user's wrapper) is a new module, in train mode at its
    root while every layer with weights is in eval mode: read as training, every weight stayed FP32
    and was cast each call, and the plan was all FP32 by cost."""

    class Wrapper(torch.nn.Module):  # reshapes the output, as users do before export or serving
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return self.inner(x).flatten()

    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).eval()
    x = torch.randn(4, 64)
    for wrapped in (torch.nn.DataParallel(mlp), Wrapper(mlp)):
        assert wrapped.training and not mlp.training
        amp = amp_compiler.compile(wrapped, x)
        assert not amp.training
        assert amp.report.summary["fp16_gemm_flop_fraction"] == 1.0, amp.report.summary["fp32_tensor_core_why"]
        torch.testing.assert_close(amp(x).float().reshape(-1), mlp(x).reshape(-1), atol=2e-2, rtol=2e-2)
    wrapped.train()  # every layer in train mode now: planned for training, weights cast each call
    assert amp_compiler.compile(wrapped, x).training


def test_compile_names_a_default_dim_of_the_wrong_kind():
    """``default_dim="8"`` failed deep in the cost model: "'<' not supported between 'str' and 'int'"."""
    import pytest

    with pytest.raises(ValueError, match=r"default_dim must be a positive int, got '8'"):
        amp_compiler.compile(torch.nn.Linear(8, 8), torch.ones(2, 8), default_dim="8")


@pytest.mark.parametrize("entry", ["compile", "compile_training"])
def test_an_example_the_model_cannot_run_is_one_error_without_torchs_tracebacks(entry):
    """A wrong example shape failed both routes with our one ConversionError, after 282 lines of
    fake-tensor tracebacks torch's loggers printed on stderr (a process of its own: torch's log
    handler holds the stderr it found at import); compile_training's trace printed them too. And
    uncaught, the error printed torch.export's and dynamo's chained tracebacks, 255 lines: torch's
    exceptions stay its unprinted ``__context__``."""
    import subprocess
    import sys
    from pathlib import Path

    call = ("amp_compiler.compile(torch.nn.Linear(8, 8), torch.ones(2, 9))" if entry == "compile" else
            "m = torch.nn.Linear(8, 8); amp_compiler.compile_training(m, lambda o, t: ((o - t) ** 2).mean(), "
            "torch.optim.SGD(m.parameters(), lr=0.1), (torch.ones(2, 9), torch.ones(2, 8)))")
    root = Path(__file__).resolve().parents[1]
    caught = f"import torch, amp_compiler\ntry:\n    {call}\nexcept amp_compiler.ConversionError as exc:\n" \
             f"    print('refused:', exc)\n"
    done = subprocess.run([sys.executable, "-c", caught], capture_output=True, text=True, timeout=300, cwd=root)
    said = "mat1 and mat2 shapes cannot be multiplied" if entry == "compile" else "a and b must have same reduction dim"
    assert "refused:" in done.stdout and said in done.stdout, done.stdout
    assert "Traceback" not in done.stderr and "fake_tensor" not in done.stderr, done.stderr[:2000]
    uncaught = subprocess.run([sys.executable, "-c", f"import torch, amp_compiler\n{call}\n"], capture_output=True,
                              text=True, timeout=300, cwd=root)
    assert uncaught.returncode == 1 and uncaught.stderr.count("Traceback") == 1, uncaught.stderr[:3000]
    assert uncaught.stderr.rstrip().splitlines()[-1].startswith("amp_compiler.errors.ConversionError: ")
    assert len(uncaught.stderr.splitlines()) < 30, uncaught.stderr[:3000]


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64))


def test_grad_mode_through_an_eval_plan_is_said_once_and_changes_nothing():
    """An eval-mode plan folds its weights: ``loss.backward()`` after a quick evaluation failed with
    torch's "element 0 of tensors does not require grad", naming nothing of ours. The first call with
    grad mode on says why and what to do (``fx_io/inference_grad.py``); the outputs are returned as
    they are, so a frozen extractor feeding a trained head trains the head, and train mode gets
    the weights' gradients."""
    import warnings

    mlp, x = _mlp().eval(), torch.randn(8, 64)
    am = amp_compiler.compile(mlp, x)
    with pytest.warns(UserWarning, match=r"eval-mode plan with grad mode on.*torch\.no_grad\(\).*model\.train\(\)"):
        out = am(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per module
        am(x)
        with torch.no_grad():
            am(x)
    assert not out.requires_grad
    head = torch.nn.Linear(64, 2)  # a frozen extractor feeding a trained head
    head(am(x).float()).sum().backward()
    assert head.weight.grad is not None and all(p.grad is None for p in mlp.parameters())
    am.train()
    am(x).float().sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in mlp.parameters())


def test_a_hook_registered_after_compile_is_said_at_the_next_call():
    """Hooks registered before compiling were warned of; one registered after was silently never
    called (neither route runs it). The next call says so, once (``model_checks.HookWatch``)."""
    mlp, x = _mlp().eval(), torch.randn(8, 64)
    am = amp_compiler.compile(mlp, x)
    called = []
    mlp[2].register_forward_hook(lambda *_: called.append(1))
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        am(x)
        am(x)
    said = [str(w.message) for w in caught if "after compiling" in str(w.message)]
    assert len(said) == 1 and "registered on 2 after compiling is not called" in said[0], said
    assert "register it on the module amp_compiler.compile returns" in said[0]
    assert not called  # what the warning says
    am.register_forward_hook(lambda *_: called.append(1))  # the advice: on the AmpModule, called every call
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        am(x)
    assert called == [1] and not [w for w in caught if "after compiling" in str(w.message)]


def test_a_module_or_parameter_replaced_after_compile_is_planned_again():
    """``model.head = nn.Linear(...)`` (same mode) or ``head.weight = nn.Parameter(...)`` after compiling:
    the export plan kept reading the tensors it was captured with, so the outputs were the old head's,
    silently (error ~1.0). The next call now says so and plans again (``model_checks.SwapWatch``)."""
    mlp, x = _mlp().eval(), torch.randn(8, 64)
    am = amp_compiler.compile(mlp, x)
    for replace, named in ((lambda: mlp.__setitem__(2, torch.nn.Linear(64, 64).eval()), "2"),
                           (lambda: setattr(mlp[0], "weight", torch.nn.Parameter(torch.randn(64, 64))), "0.weight")):
        replace()
        with torch.no_grad(), pytest.warns(UserWarning, match=rf"AmpModule\(Sequential\): {named} was replaced") as said:
            out = am(x)
        assert [w.filename for w in said] == [__file__]  # the user's line (user_frame.py), not torch's
        torch.testing.assert_close(out, mlp(x).detach(), atol=2e-2, rtol=2e-2)
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("error")  # planned for the new one: said once
            am(x)
        assert am.plans == 1


def test_a_warning_made_during_a_call_points_at_the_callers_line():
    """The eval-mode-with-grad warning pointed into torch's module.py: a fixed stacklevel missed a
    frame of ``torch.compiler.disable`` (``user_frame.user_stacklevel`` counts them)."""
    am = amp_compiler.compile(_mlp().eval(), torch.randn(8, 64))
    with pytest.warns(UserWarning, match="runs its eval-mode plan with grad mode on") as said:
        am(torch.randn(8, 64))
    assert [w.filename for w in said] == [__file__]


def test_a_forward_that_replaces_its_own_buffer_is_not_planned_again():
    """Dynamo's route runs the forward's Python: a buffer it reassigns at every call is state, not a
    replacement to plan again for (``AmpModule.forward`` re-reads the modules after the call)."""

    class Caching(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)
            self.register_buffer("last", torch.zeros(8))

        def forward(self, x):
            y = self.lin(x)
            if y.sum() > 0:  # a branch on a value: the dynamo route
                y = y * 2
            self.last = y.sum(0).detach()
            return y

    model, x = Caching().eval(), torch.randn(4, 8)
    with torch.no_grad():
        am = amp_compiler.compile(model, x)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for _ in range(3):
                am(x)
    assert "dynamo" in am.capture and am.plans == 1


@pytest.mark.parametrize("dtype", [torch.float64, torch.int64])
def test_an_example_of_a_dtype_the_model_refuses_is_refused_at_compile(dtype):
    """Fake tensors' meta kernels run an addmm of float64 (or int64) inputs and float32 weights, so a
    float64 example was captured and planned, and the first call failed inside the plan ("mat1 and
    mat2 must have the same dtype"), as eager does at once. Now compile refuses it, naming the op, the
    module and the fix; without an example, the first call does (before any plan)."""
    mlp, x = _mlp().eval(), torch.randn(8, 64).to(dtype)
    named = rf"Sequential: aten.addmm, module 0 \(Linear\): reads {str(dtype)[6:]} and float32 tensors"
    with pytest.raises(amp_compiler.ConversionError, match=named + r".*pass example inputs of that dtype"):
        amp_compiler.compile(mlp, x)
    am = amp_compiler.compile(mlp)
    with pytest.raises(amp_compiler.ConversionError, match=named):
        am(x)
    assert am.plans == 0


def test_meta_weights_or_inputs_are_refused_with_what_to_do():
    """A model built under ``torch.device("meta")`` (or a meta example) failed deep in the capture with
    "Tensor.item() cannot be called on meta tensors". Now one ``ValueError`` says what is meta and how
    to materialise it; a meta model compiled without an example plans once ``to_empty`` + loaded."""
    real = _mlp().eval()
    with torch.device("meta"):
        meta = _mlp().eval()
    x = torch.randn(8, 64)
    with pytest.raises(ValueError, match=r"the model's weights \(0.weight and 3 more\) are on the 'meta' device.*"
                                         r"model.to_empty\(device=...\), then model.load_state_dict"):
        amp_compiler.compile(meta, x)
    with pytest.raises(ValueError, match=r"the example inputs are on the 'meta' device.*pass real tensors"):
        amp_compiler.compile(real, x.to("meta"))
    am = amp_compiler.compile(meta)
    with pytest.raises(ValueError, match=r"are on the 'meta' device"):
        am(x)
    am.to_empty(device="cpu")
    meta.load_state_dict(real.state_dict())
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")  # no plan was made yet: nothing to say about new tensors
        torch.testing.assert_close(am(x), real(x), atol=2e-2, rtol=2e-2)


class _Attend(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = torch.nn.Linear(64, 64), torch.nn.Linear(64, 64)

    def forward(self, x):
        return self.b(torch.softmax(self.a(x), -1))


def test_rule_names_are_checked_and_onnx_spellings_name_their_ops():
    """``deny=["sofmax"]``, ``allow=["gem"]``, ``deny_nodes=["nope"]`` planned as if not given, and
    ``deny=["Softmax"]`` (the README's spelling) denied nothing: the torch path never checked names.
    Now as on the ONNX path (``fx_io.importer.resolve_rule_names``)."""
    model, x = _Attend().eval(), torch.randn(64, 64)
    softmax = lambda am: next(o for o in am.report.ops if o["canonical"] == "softmax")  # noqa: E731
    for spelling in ("Softmax", "softmax", "aten._softmax"):
        am = amp_compiler.compile(model, x, deny=[spelling])
        assert softmax(am)["precision"] == "float32" and "named by the user" in softmax(am)["reason"], spelling
    for options, says in ((dict(deny=["sofmax"]), "deny sofmax: no op type 'sofmax' in ONNX or the registry; "
                                                   "closest: 'softmax'"),
                          (dict(allow=["gem"]), "closest: 'gemm'"),
                          (dict(deny_nodes=["a/aten.adm"]), "no node is named 'a/aten.adm'; closest: 'a/aten.addmm'")):
        with pytest.raises(ConversionError, match=re.escape(says)):
            amp_compiler.compile(model, x, **options)
    with pytest.warns(UserWarning, match="deny conv2d: the model has no conv2d op; the option changes nothing") as said:
        amp_compiler.compile(model, x, deny=["conv2d"])
    assert [w.filename for w in said] == [__file__]
    loss = lambda out, target: ((out - target) ** 2).mean()  # noqa: E731
    with pytest.raises(ConversionError, match="deny sofmax: no op type 'sofmax'"):
        amp_compiler.compile_training(model.train(), loss, torch.optim.SGD(model.parameters(), lr=0.1), (x, x),
                                      deny=["sofmax"])


def test_transformers_output_recording_hooks_are_not_taken_for_the_users():
    """A BERT called once with ``output_hidden_states=True`` (comparing with eager) gets transformers'
    output-recording hooks for good: the next call and any later compile warned of forward hooks
    "not called", which the user never registered, while the hidden states came back right."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                     num_attention_heads=4, max_position_embeddings=32)
    model, ids = transformers.BertModel(config).eval(), torch.randint(1, 128, (2, 10))
    with torch.no_grad():
        am = amp_compiler.compile(model, example_kwargs=dict(input_ids=ids))
        am(input_ids=ids)
        expected = model(input_ids=ids, output_hidden_states=True).hidden_states
        assert any(m._forward_hooks for m in model.modules())  # transformers' own, installed now
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = am(input_ids=ids, output_hidden_states=True).hidden_states
            amp_compiler.compile(model, example_kwargs=dict(input_ids=ids))(input_ids=ids)
    assert all(torch.allclose(a, b, atol=1e-2) for a, b in zip(got, expected))
    model.encoder.layer[0].register_forward_hook(lambda *_: None)  # the user's own is still said
    with torch.no_grad(), pytest.warns(UserWarning, match="forward hook registered on encoder.layer.0 after compiling"):
        am(input_ids=ids)


def test_keyword_examples_given_as_example_inputs_are_named_as_such():
    """``example_inputs={"x": x}`` (meant as ``example_kwargs``) failed deep in the capture on "'dict' object
    has no attribute 'size'"; a forward that takes a dict positionally is left alone."""

    class TakesDict(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(64, 64)

        def forward(self, batch):
            return self.lin(batch["x"])

    x = torch.randn(8, 64)
    with pytest.raises(TypeError, match=r"example_inputs is a dict of the forward's keyword arguments \(input\): "
                                        r"pass it as example_kwargs="):
        amp_compiler.compile(_mlp().eval(), {"input": x})
    with torch.no_grad():
        out = amp_compiler.compile(TakesDict().eval(), {"x": x})({"x": x})
    assert out.shape == (8, 64)
