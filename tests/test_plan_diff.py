"""amp-compile --compare: which ops changed precision between two plans, and the predicted effect."""

from __future__ import annotations

import json

import onnx
import pytest

from amp_compiler import convert_onnx
from amp_compiler.cli import main
from amp_compiler.plan_diff import compare, load, to_text
from benchmarks.synthetic import transformer_graph


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    """The same model planned as is and with Softmax denied, saved as JSON reports (every op that may run
    FP16 does, so the denied ops are the only difference: the cost model would re-plan around them)."""
    folder = tmp_path_factory.mktemp("plans")
    model = transformer_graph(72)
    paths = []
    for name, deny in (("a.json", ()), ("b.json", ("Softmax",))):
        _, report = convert_onnx(model, deny=deny, planner="all", deny_propagation=False)
        paths.append(report.save(folder / name))
    onnx.save(transformer_graph(24, hidden=64), folder / "other.onnx")
    _, other = convert_onnx(onnx.load(folder / "other.onnx"))
    paths.append(other.save(folder / "other.json"))
    return paths


def test_the_ops_that_changed_are_exactly_the_denied_ones(plans):
    a, b = load(plans[0]), load(plans[1])
    diff = compare(a, b)
    softmax_low = {o["name"] for o in a.ops if o["op_type"] == "Softmax" and o["precision"] == "float16"}
    assert softmax_low, "the plain plan runs Softmax in FP16"
    assert {c["name"] for c in diff["changed"]} == softmax_low
    for c in diff["changed"]:
        assert (c["from"], c["to"]) == ("float16", "float32")
        op = next(o for o in a.ops if o["name"] == c["name"])
        assert c["time_delta_s"] == pytest.approx(op["predicted_time_fp32_s"] - op["predicted_time_fp16_s"])
    assert diff["totals"]["fp32_nodes"] == (a.summary["fp32_nodes"], b.summary["fp32_nodes"])
    text = to_text(diff)
    assert f"{len(softmax_low)} op(s) changed precision" in text
    assert "the whole plan +" in text  # FP32 Softmax between FP16 GEMMs adds casts: slower


def test_cli_exit_status_says_whether_plans_differ(plans, capsys):
    a, b, other = map(str, plans)
    assert main(["--compare", a, b]) == 1
    assert "changed precision" in capsys.readouterr().out
    assert main(["--compare", a, a, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["changed"] == []
    assert main(["--compare", a, other]) == 2
    assert "not plans of the same model" in capsys.readouterr().err


def test_bad_input_is_one_line_naming_the_file(tmp_path, plans, capsys):
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    assert main(["--compare", str(broken), str(plans[0])]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(broken) in err and "not a JSON report" in err


def test_compare_help_needs_no_files(capsys):
    assert main(["--compare", "--help"]) == 0
    assert "amp-compile --compare A.json B.json" in capsys.readouterr().out
