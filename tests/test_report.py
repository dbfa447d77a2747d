"""Tests for amp_compiler.report: text, JSON, HTML renderings and atomic saving."""

from __future__ import annotations

import copy
import html
import json
import os
import re

import pytest

from amp_compiler import atomic
from amp_compiler import report as report_mod
from amp_compiler.report import SCHEMA_VERSION, Report
from amp_compiler.report.schema import canonical

CLASSES = ("allow", "infer", "clear", "deny", "unknown")


def make_ops(n: int, *, fp32_every: int = 4, name_prefix: str = "/layer") -> list[dict]:
    """N ops cycling through the classes; every ``fp32_every``-th op (and every deny/unknown op)
    stays FP32; clear ops are ``n/a``."""
    ops = []
    for i in range(n):
        cls = CLASSES[i % len(CLASSES)]
        if cls in ("deny", "unknown") or (fp32_every and i % fp32_every == 0 and cls != "clear"):
            prec = "float32"
        elif cls == "clear":
            prec = "n/a"
        else:
            prec = "float16"
        ops.append({
            "name": f"{name_prefix}.{i}/Op{i}",
            "op_type": {"allow": "MatMul", "infer": "Add", "clear": "Reshape", "deny": "Softmax",
                        "unknown": "custom.MyOp"}[cls],
            "canonical": cls + "_op",
            "class": cls,
            "precision": prec,
            "reason": f"reason-{i}: {cls} rule -> {prec}",
            "flops": 1.0e6 * (i + 1),
            "bytes": 4096.0 * (i + 1),
            "predicted_time_fp32_s": 1e-5 * (i + 1),
            "predicted_time_fp16_s": 3e-6 * (i + 1),
            "casts": i % 2,
        })
    return ops


def make_report(n_ops: int = 12, *, full: bool = True, **kw) -> dict:
    ops = make_ops(n_ops, **kw)
    d = {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "amp-compiler", "version": "0.1.0"},
        "source": "model.onnx",
        "summary": {
            "nodes": len(ops),
            "fp16_nodes": sum(o["precision"] == "float16" for o in ops),
            "fp32_nodes": sum(o["precision"] == "float32" for o in ops),
            "casts": 2, "cast_bytes": 123456, "gemm_flops": 1.2e10,
            "fp16_gemm_flop_fraction": 0.75,
            "predicted_time_fp32_s": 0.0021, "predicted_time_mixed_s": 0.0007,
            "predicted_time_all_fp16_s": 0.00068, "predicted_speedup_vs_fp32": 3.0,
            "target": "h100", "dtype": "float16", "planner": "optimal",
            "unknown_ops": ["custom.MyOp"],
        },
        "ops": ops,
        "casts": [
            {"name": "x_cast_fp16", "tensor": "x", "from": "float32", "to": "float16",
             "bytes": 6144, "reason": "graph input kept FP32 (keep_io_types)"},
            {"name": "y_cast_fp32", "tensor": "y", "from": "float16", "to": "float32",
             "bytes": 117312, "reason": "softmax input"},
        ],
        "passes": [
            {"name": "classify", "time_s": 0.002, "changed": True, "details": f"{n_ops} ops classified"},
            {"name": "propagate", "time_s": 0.00015, "changed": False, "details": "no change"},
        ],
    }
    if full:
        d["alignment"] = [{"op": "/fc/MatMul", "message": "N=1001 is not a multiple of 8"}]
        d["validation"] = {"tolerance": 0.01, "passed": True, "outputs": [
            {"name": "logits", "max_abs_error": 0.001, "max_rel_error": 0.0004}]}
    return d


def section(text: str, title_start: str) -> list[str]:
    """Lines of the text-report section whose title starts with ``title_start``."""
    lines = text.splitlines()
    start = next(i for i, l in enumerate(lines) if l.startswith(title_start))
    out = []
    for l in lines[start + 2:]:          # skip title and its ═ underline
        if not l.strip():
            break
        out.append(l)
    return out


# ----------------------------------------------------------------------------- text

def test_text_header_and_summary():
    text = Report(make_report()).to_text()
    assert "model.onnx" in text.splitlines()[0]
    assert re.search(r"target h100 .*dtype float16 .*planner optimal", text)
    summary = "\n".join(section(text, "Summary"))
    assert "12 (" in summary and "FP32)" in summary
    assert "120.6 KiB" in summary              # 123456 bytes
    assert "75.0% of GEMM/conv FLOPs" in summary
    assert "FP32 2.10 ms" in summary and "mixed 700.0 µs" in summary and "all-FP16 680.0 µs" in summary
    assert "3.00× vs FP32" in summary
    assert "custom.MyOp" in summary


def test_a_bf16_report_names_its_ceiling_all_bf16():
    """Under --dtype bf16 the summary rows had read "all-FP16" beside first lines saying all-bf16."""
    d = make_report()
    d["summary"].update(dtype="bfloat16", predicted_memory_fp32_bytes=4096, predicted_memory_mixed_bytes=2048,
                        predicted_memory_all_fp16_bytes=2048, predicted_speedup_vs_all_fp16=0.97)
    summary = "\n".join(section(Report(d).to_text(), "Summary"))
    page = Report(d).to_html()
    for text in (summary, page):
        assert "all-FP16" not in text and "all-BF16 680.0 µs" in text and "0.97× of all-BF16" in text
    assert "all-BF16 2.0 KiB" in summary


def test_text_lists_every_fp32_op_with_reason():
    data = make_report(30)
    fp32 = [o for o in data["ops"] if o["precision"] == "float32"]
    assert 5 < len(fp32) < 30
    text = Report(data).to_text()
    rows = section(text, "Ops kept in FP32")
    assert len(rows) == 2 + len(fp32)          # header + rule + one row per op
    for op, row in zip(fp32, rows[2:]):
        assert op["name"] in row
        assert op["reason"] in row
        assert op["class"] in row
    # FP16 ops are not in the FP32 table
    fp16_names = {o["name"] for o in data["ops"] if o["precision"] == "float16"}
    assert not any(n + " " in r for r in rows for n in fp16_names)


def test_text_counts_per_class():
    ops = [
        {"name": "a", "class": "allow", "precision": "float16"},
        {"name": "b", "class": "allow", "precision": "float16"},
        {"name": "c", "class": "allow", "precision": "float32"},
        {"name": "d", "class": "infer", "precision": "float16"},
        {"name": "e", "class": "clear", "precision": "n/a"},
        {"name": "f", "class": "deny", "precision": "float32"},
        {"name": "g", "class": "deny", "precision": "float32"},
        {"name": "h", "precision": "float32"},                   # no class -> unknown
    ]
    text = Report({"schema_version": "1.0", "ops": ops}).to_text()
    rows = section(text, "Ops by class")
    assert rows[0].split() == ["class", "ops", "FP16", "FP32", "n/a"]
    table = {r.split()[0]: r.split()[1:] for r in rows[2:]}
    assert [r.split()[0] for r in rows[2:]] == ["allow", "infer", "clear", "deny", "unknown", "total"]
    assert table["allow"] == ["3", "2", "1", "0"]
    assert table["infer"] == ["1", "1", "0", "0"]
    assert table["clear"] == ["1", "0", "0", "1"]
    assert table["deny"] == ["2", "0", "2", "0"]
    assert table["unknown"] == ["1", "0", "1", "0"]
    assert table["total"] == ["8", "3", "4", "1"]
    # one summary derivation (plan_report.build_report): the renderer shows it, never recomputes it
    assert "— (— FP16, — FP32)" in text
    with_summary = Report({"ops": ops, "summary": {"nodes": 9, "fp16_nodes": 5, "fp32_nodes": 4}}).to_text()
    assert "9 (5 FP16, 4 FP32)" in with_summary


@pytest.mark.parametrize("n_fp32,max_rows", [(100, 10), (61, 60), (7, 0)])
def test_text_truncation_count(n_fp32, max_rows):
    ops = [{"name": f"op{i}", "op_type": "Exp", "class": "deny", "precision": "float32",
            "reason": "deny"} for i in range(n_fp32)]
    text = Report({"ops": ops}).to_text(max_rows=max_rows)
    rows = section(text, "Ops kept in FP32")
    shown = [r for r in rows if re.match(r"\s+op\d+\s", r)]
    assert len(shown) == max_rows
    assert f"… {n_fp32 - max_rows} more (see --report" in text
    assert rows[-1].strip().startswith("…")


def test_text_no_truncation_when_fits_or_unlimited():
    data = make_report(200)
    n_fp32 = sum(o["precision"] == "float32" for o in data["ops"])
    full = Report(data).to_text(max_rows=None)
    assert "more (see --report" not in full
    assert all(o["name"] in full for o in data["ops"] if o["precision"] == "float32")
    cut = Report(data).to_text()
    assert f"… {n_fp32 - 60} more" in cut
    assert str(Report(data)) == cut
    with pytest.raises(ValueError):
        Report(data).to_text(max_rows=-1)


def test_text_width_and_ellipsis():
    data = make_report(5)
    long_name = "/encoder/" + "very_long_segment/" * 20 + "Softmax_final"
    data["ops"][3]["name"] = long_name                       # a deny op -> FP32 table
    data["ops"][3]["reason"] = "deny: " + "numerically unsafe " * 30
    data["source"] = "/models/" + "x" * 300 + ".onnx"
    text = Report(data).to_text()
    assert max(len(l) for l in text.splitlines()) <= 120
    row = next(r for r in section(text, "Ops kept in FP32") if "Softmax_final" in r)
    assert "…" in row and long_name not in row
    assert row.split()[0].startswith("/encoder/")           # both ends of the name kept


def test_text_strips_control_characters():
    data = make_report(5)
    data["ops"][3]["name"] = "evil\x1b[2J\nname"
    text = Report(data).to_text()
    assert "\x1b" not in text
    assert any("evil" in l and "name" in l for l in text.splitlines())


def test_text_shows_casts_passes_alignment_validation():
    text = Report(make_report()).to_text()
    casts = "\n".join(section(text, "Casts"))
    assert "x_cast_fp16" in casts and "FP32 → FP16" in casts and "6.0 KiB" in casts
    passes = section(text, "Passes")
    classify = next(r for r in passes if "classify" in r)
    assert "2.00 ms" in classify and "yes" in classify
    assert "no" in next(r for r in passes if "propagate" in r).split()
    assert "N=1001 is not a multiple of 8" in text
    assert "Validation: PASSED" in text and "logits" in text


def test_missing_optional_sections_render():
    data = make_report(5, full=False)
    text = Report(data).to_text()
    assert "Validation" not in text and "alignment" not in text
    html_ = Report(data).to_html()
    assert 'id="validation"' not in html_

    minimal = {"schema_version": "1.0", "ops": [], "casts": [], "passes": []}
    for d in (minimal, {}):
        r = Report(d)
        t = r.to_text()
        assert "Ops kept in FP32 (0 of 0)" in t
        assert "none" in t
        h = r.to_html()
        assert h.startswith("<!DOCTYPE html>") and h.rstrip().endswith("</html>")
        assert r.summary == {} or r.summary == d.get("summary")
        assert r.ops == [] and r.casts == [] and r.passes == []
        assert r.validation is None


def test_tensor_core_line_without_gemms():
    """A plan with no GEMM/conv says so; it is not '100% of GEMM/conv FLOPs' (the summary's fraction
    is 1.0 then: nothing left FP32)."""
    with_gemms = Report(make_report(3))
    assert "75.0% of GEMM/conv FLOPs" in with_gemms.to_text()
    data = make_report(3)
    data["summary"].update(gemm_flops=0.0, fp16_gemm_flop_fraction=1.0)
    text, page = Report(data).to_text(), Report(data).to_html()
    assert "no GEMM/conv ops" in text and "100.0%" not in text
    assert "no GEMM/conv ops" in page and "100.0%" not in page


def test_validation_failure_rendered():
    data = make_report(3)
    data["validation"] = {"tolerance": 1e-3, "passed": False,
                          "outputs": [{"name": "out", "max_abs_error": 0.5, "max_rel_error": 0.2,
                                       "passed": False}]}
    assert "Validation: FAILED" in Report(data).to_text()
    assert "FAILED" in Report(data).to_html()


# ----------------------------------------------------------------------------- JSON

def test_json_round_trip_and_key_order(tmp_path):
    data = make_report(20)
    # scramble insertion order: schema_version last
    scrambled = {k: data[k] for k in reversed(list(data))}
    r = Report(scrambled)
    text = r.to_json()
    assert json.loads(text) == data
    assert Report.from_json(text).data == data
    assert list(json.loads(text))[0] == "schema_version"
    assert text.lstrip("{\n ").startswith(f'"schema_version": "{SCHEMA_VERSION}"')
    assert text == Report(data).to_json()                     # stable whatever the insertion order
    assert r.to_json(indent=None).count("\n") == 0
    p = tmp_path / "r.json"
    p.write_text(text, encoding="utf-8")
    assert Report.from_json(p).data == data
    assert Report.from_json(str(p)).data == data


def test_json_one_record_per_line():
    """Each op, cast and pass of the indented JSON is one line (json's C encoder writes it), the
    rest indented; it reads back as the data, a reason with a newline or a quote included."""
    data = make_report(5)
    data["ops"][0]["reason"] = 'two\nlines, "quoted" }, {'
    data["validation"] = {"tolerance": 1e-3, "passed": True,
                          "outputs": [{"name": "out", "max_abs_error": 0.0, "max_rel_error": 0.0, "passed": True}]}
    text = Report(data).to_json()
    assert json.loads(text) == canonical(data)
    lines = text.splitlines()
    for key in ("ops", "casts", "passes"):
        start = lines.index(f'  "{key}": [')
        rows = lines[start + 1:start + 1 + len(data[key])]
        assert [json.loads(row.strip().rstrip(",")) for row in rows] == canonical(data)[key]
        assert lines[start + 1 + len(data[key])] in ("  ]", "  ],")
    assert '    "tolerance": 0.001,' in lines  # a record that is not in a list of them is indented
    assert '      {' in lines  # and so are the records of a list inside one (validation outputs)


def test_json_rejects_other_major_version():
    with pytest.raises(ValueError, match="schema_version"):
        Report.from_json('{"schema_version": "2.0", "ops": []}')
    with pytest.raises(ValueError):
        Report.from_json("[1, 2]")


def test_report_does_not_mutate_input():
    data = make_report(10)
    before = copy.deepcopy(data)
    r = Report(data)
    r.to_text(), r.to_json(), r.to_html()
    assert data == before


# ----------------------------------------------------------------------------- HTML

def test_html_escapes_and_lists_every_op():
    data = make_report(25)
    evil = "<script>alert(1)</script>"
    data["ops"][3]["name"] = evil
    data["ops"][4]["reason"] = '"><img src=x onerror=alert(2)>'
    data["casts"][0]["tensor"] = "<b>t</b>"
    data["source"] = "<i>m</i>.onnx"
    page = Report(data).to_html()
    assert evil not in page
    assert "<img src=x" not in page and "<b>t</b>" not in page and "<i>m</i>" not in page
    assert html.escape(evil) in page
    for op in data["ops"]:
        assert html.escape(op["name"]) in page
    # exactly one script element: ours
    assert page.count("<script>") == 1
    # every op has a row in the static table (readable with JS off)
    body = page.split('<table id="ops"', 1)[1].split("</table>", 1)[0]
    assert body.count("<tr class=") == len(data["ops"])


def test_html_content():
    data = make_report(10)
    page = Report(data).to_html()
    assert page.startswith("<!DOCTYPE html>")
    assert "<style>" in page and "http://" not in page and "https://" not in page  # self-contained
    assert 'class="prec p-fp32"' in page and 'class="prec p-fp16"' in page
    for c in data["casts"]:
        assert c["name"] in page
    for p in data["passes"]:
        assert p["name"] in page
    assert 'id="validation"' in page and "logits" in page
    assert "N=1001 is not a multiple of 8" in page
    assert 'id="op-filter"' in page and " hidden" in page      # filter box only shown by JS
    assert "3.00×" in page and "120.6 KiB" in page


def test_html_says_what_the_text_report_s_first_lines_say():
    """Why tensor-core work stayed FP32, a near tie, nothing to do, how the inputs were drawn: the
    text report led with them and the HTML page had none."""
    data = make_report(10)
    data["summary"].update(fp32_tensor_core_why="FP32 by cost (ort-cuda): 3 tensor-core ops\nwould change it: --dim N",
                           near_tie="+1.0 µs (0.5%) over FP32", nothing_to_do="nothing to do: <already> FP16",
                           inputs_drawn={"pixel_values": "images in [0, 1]; batch = 1, pinned by Reshape 'r'"})
    page = Report(data).to_html()
    for said in ("FP32 by cost (ort-cuda): 3 tensor-core ops", "would change it: --dim N",
                 "near tie: +1.0 µs (0.5%) over FP32", "nothing to do: &lt;already&gt; FP16",
                 "input pixel_values: images in [0, 1]; batch = 1, pinned by Reshape &#x27;r&#x27;"):
        assert said in page, said
    assert "near tie" not in Report(make_report(10)).to_html()


# ----------------------------------------------------------------------------- save

@pytest.mark.parametrize("suffix,check", [
    (".json", lambda s: json.loads(s)["schema_version"] == SCHEMA_VERSION),
    (".html", lambda s: s.startswith("<!DOCTYPE html>")),
    (".htm", lambda s: s.startswith("<!DOCTYPE html>")),
    (".HTML", lambda s: s.startswith("<!DOCTYPE html>")),
    (".txt", lambda s: "Ops kept in FP32" in s and not s.startswith("<")),
])
def test_save_picks_format(tmp_path, suffix, check):
    r = Report(make_report(100))
    p = tmp_path / f"report{suffix}"
    assert r.save(p) == p
    content = p.read_text(encoding="utf-8")
    assert check(content)
    assert os.listdir(tmp_path) == [p.name]                    # no temp file left behind


def test_save_txt_is_untruncated(tmp_path):
    data = make_report(300)
    p = tmp_path / "r.txt"
    Report(data).save(p)
    text = p.read_text(encoding="utf-8")
    assert "more (see --report" not in text
    assert all(o["name"] in text for o in data["ops"] if o["precision"] == "float32")


@pytest.mark.parametrize("name", ["report.pdf", "report", "report.json.gz"])
def test_save_rejects_unknown_suffix(tmp_path, name):
    p = tmp_path / name
    with pytest.raises(ValueError) as exc:
        Report(make_report(3)).save(p)
    msg = str(exc.value)
    suffix = os.path.splitext(name)[1]
    assert (repr(suffix) in msg) if suffix else "no suffix" in msg
    assert ".json" in msg and ".html" in msg and ".txt" in msg
    assert os.listdir(tmp_path) == []


def test_save_failure_leaves_old_file_and_no_temp(tmp_path, monkeypatch):
    p = tmp_path / "r.json"
    p.write_text("old", encoding="utf-8")

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(atomic.os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        Report(make_report(3)).save(p)
    assert p.read_text(encoding="utf-8") == "old"
    assert os.listdir(tmp_path) == ["r.json"]


def test_save_overwrites_atomically(tmp_path):
    p = tmp_path / "r.json"
    p.write_text("old", encoding="utf-8")
    Report(make_report(3)).save(str(p))
    assert json.loads(p.read_text(encoding="utf-8"))["source"] == "model.onnx"
    assert os.listdir(tmp_path) == ["r.json"]


def test_html_extra_sections_come_after_the_standard_ones_in_order():
    r = Report(make_report())
    r.html_sections.append(("Graph <view>", '<svg id="graph"></svg>'))
    page = r.to_html(sections=[("More", '<p id="more">x</p>')])
    graph, more = page.index('<svg id="graph">'), page.index('<p id="more">')
    assert page.index('id="validation"') < graph < more < page.index("</main>")
    assert "<h2>Graph &lt;view&gt;</h2>" in page       # the title is escaped, the content is not
    assert '<svg id="graph">' not in Report(make_report()).to_html()


# ----------------------------------------------------------------------------- units

@pytest.mark.parametrize("fn,value,expected", [
    (report_mod.fmt_time, 8.03e-05, "80.3 µs"),
    (report_mod.fmt_time, 0.0021, "2.10 ms"),
    (report_mod.fmt_time, 5e-7, "500 ns"),
    (report_mod.fmt_time, None, "—"),
    (report_mod.fmt_bytes, 512, "512 B"),
    (report_mod.fmt_bytes, 123456, "120.6 KiB"),
    (report_mod.fmt_bytes, 3 * 1024**3, "3.0 GiB"),
    (report_mod.fmt_flops, 1.2e10, "12.00 GFLOP"),
    (report_mod.fmt_pct, 1.0, "100.0%"),
])
def test_units(fn, value, expected):
    assert fn(value) == expected
