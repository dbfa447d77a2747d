"""Rule values that match nothing in the model are refused or said (``amp_compiler/rule_names.py``):
``--deny Softmx``, ``--force-op Gelux``, a ``--deny-node`` from another export and an
``--exclude-nodes`` pattern that matches no name had each converted as if not given."""

from __future__ import annotations

import warnings

import onnx
import pytest
from onnx import helper

from amp_compiler import convert_onnx
from amp_compiler.cli import main
from amp_compiler.errors import ConversionError

from .builders import fin, model, weight


def _attention_head() -> onnx.ModelProto:
    nodes = [helper.make_node("MatMul", ["x", "Wq"], ["q"], name="/attn/query/MatMul"),
             helper.make_node("Softmax", ["q"], ["p"], name="/attn/Softmax", axis=-1),
             helper.make_node("MatMul", ["p", "Wo"], ["y"], name="/attn/out/MatMul")]
    return model(nodes, [fin("x", 64, 64)], [fin("y", 64, 64)], [weight("Wq", 64, 64), weight("Wo", 64, 64)])


@pytest.mark.parametrize("option, value, says", [
    ("--deny", "Softmx", "--deny Softmx: no op type 'Softmx' in ONNX or the registry; closest: 'Softmax'"),
    ("--force-op", "Gelux", "--force-op Gelux: no op type 'Gelux' in ONNX or the registry"),
    # a typo of an op the model does not hold: the closest ONNX names (there had been none)
    ("--deny", "LayerNormalisation", "no op type 'LayerNormalisation' in ONNX or the registry; closest: "
                                     "'LayerNormalization'"),
    ("--allow", "Einsm", "--allow Einsm: no op type 'Einsm' in ONNX or the registry; closest: 'Einsum'"),
    ("--deny-node", "/attn/query/MatMull", "no node is named '/attn/query/MatMull'; closest: '/attn/query/MatMul'"),
    ("--exclude-nodes", "query", "--exclude-nodes 'query': matches no node name (a pattern matches the start"),
    ("--include-nodes", "/mlp/.*", "--include-nodes '/mlp/.*': matches no node name"),
])
def test_a_value_matching_nothing_is_one_clear_error(tmp_path, capsys, option, value, says):
    src = tmp_path / "m.onnx"
    onnx.save(_attention_head(), str(src))
    assert main([str(src), "-o", str(tmp_path / "out.onnx"), option, value]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("[")]  # not progress
    assert len(err) == 1 and err[0].startswith(f"amp-compile: error: {src}: ") and says in err[0], err
    assert not (tmp_path / "out.onnx").exists()


@pytest.mark.parametrize("options", [{}, {"planner": "all"}], ids=["default", "all"])
def test_a_real_op_type_the_model_lacks_warns_and_changes_nothing(options):
    plain = {o["name"]: o["precision"] for o in convert_onnx(_attention_head(), **options)[1].ops}
    with pytest.warns(UserWarning, match="--deny Gelu: the model has no Gelu op; the option changes nothing"):
        _, report = convert_onnx(_attention_head(), deny=["Gelu"], **options)
    assert {o["name"]: o["precision"] for o in report.ops} == plain
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a type the model has, a canonical name, a matching pattern: silent
        _, report = convert_onnx(_attention_head(), deny=["softmax"], exclude_nodes=[".*out"], **options)
    precision = {o["name"]: o["precision"] for o in report.ops}
    assert precision["/attn/Softmax"] == precision["/attn/out/MatMul"] == "float32"
    with pytest.raises(ConversionError, match="--deny-node /nope"):
        convert_onnx(_attention_head(), deny_nodes=["/nope"], **options)
