"""The plan drawn: the op graph as inline SVG, coloured by precision, casts on the edges.

Built from the report dict alone (schema 1.1 ``ops[].inputs/outputs`` and ``casts[].output``;
docs/report-schema.md), so a saved JSON report draws the same. The layout is our own
layered one (docs/architecture.md, Report): each op on the row of its longest path from
the inputs (Kahn's order), sources pulled down next to their first reader, then two
barycenter sweeps order each row to shorten edges. Model graphs are long, narrow chains
of blocks; that is all they need, in O(ops + edges), with no layout library to ship.

Ops without float data are left out (the table lists them); over ``MAX_DRAWN`` ops each
module group becomes one box. The page script (``GRAPH_JS``) adds zoom/pan, search,
graph <-> table links and collapsing of module groups (``group_of``). Everything is
inline; nothing is fetched.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field
from collections.abc import Mapping
from typing import Any

NODE_W, NODE_H, ROW_H, COL_W, PAD = 132, 26, 50, 172, 24
MAX_DRAWN = 4000  # ops; beyond this the SVG would be slower to open than the table is to read

# colour category -> legend label (CSS in GRAPH_CSS)
CATEGORIES = {"fp16": "FP16", "bf16": "BF16", "fp32-rule": "FP32 by rule", "fp32-cost": "FP32 by cost",
              "unknown": "unknown op (FP32)", "none": "no float data"}
_COST_MARKS = ("by the cost model", "not between low ops")


def category(op: Mapping[str, Any]) -> str:
    """The colour category of an op: its precision, and for FP32 whether a rule or the cost chose it."""
    precision, reason = op.get("precision"), str(op.get("reason") or "")
    if op.get("class") == "unknown":
        return "unknown"
    if precision == "float16":
        return "fp16"
    if precision == "bfloat16":
        return "bf16"
    if precision == "float32":
        return "fp32-cost" if any(m in reason for m in _COST_MARKS) else "fp32-rule"
    return "none"


def group_of(op: Mapping[str, Any]) -> str:
    """The module group of an op: its subgraph scope, else its module path (the exporter's,
    ``m.encoder.layer.3.attention`` -> ``m.encoder.layer.3``, or its name's:
    ``/encoder/layer.3/attention/MatMul`` -> ``/encoder/layer.3``) up to the first numbered
    part, else the path's first two parts; "" if it has none."""
    if op.get("scope"):
        return str(op["scope"])
    if op.get("module"):
        sep, parts = ".", str(op["module"]).split(".")
    else:
        sep, parts = "/", str(op.get("name") or "").strip("/").split("/")[:-1]
    lead = "/" if sep == "/" else ""
    for i, part in enumerate(parts):
        if any(c.isdigit() for c in part):
            return lead + sep.join(parts[:i + 1])
    return lead + sep.join(parts[:2]) if parts else ""


@dataclass
class Edge:
    src: int
    dst: int
    tensor: str
    cast: Mapping[str, Any] | None = None


@dataclass
class Drawing:
    """Nodes (report ops, then graph input/output pseudo-nodes), edges and their positions."""

    labels: list[str] = field(default_factory=list)
    ops: list[Mapping[str, Any] | None] = field(default_factory=list)  # None for a pseudo-node
    index: list[int] = field(default_factory=list)  # the op's position in the report's ops (-1: pseudo)
    edges: list[Edge] = field(default_factory=list)
    xy: list[tuple[float, float]] = field(default_factory=list)
    width: float = 0.0
    height: float = 0.0
    hidden: int = 0  # ops without float data, not drawn
    folded: int = 0  # module groups drawn as one box each (graphs over MAX_DRAWN ops)


def drawn(data: Mapping[str, Any]) -> list[int]:
    """Indices of the ops the graph shows: those that read or write a float tensor. Shape
    arithmetic and integer constants (a third of a TorchScript export) have no precision to
    show and would only widen the picture; the table lists them. All ops without a tensors table."""
    ops = data.get("ops") or []
    table = data.get("tensors")
    if not isinstance(table, list):
        return list(range(len(ops)))
    floats = {t.get("name") for t in table if isinstance(t, Mapping)}
    return [i for i, op in enumerate(ops) if isinstance(op, Mapping)
            and any(t in floats for t in (*(op.get("inputs") or ()), *(op.get("outputs") or ())))]


def build(data: Mapping[str, Any]) -> Drawing:
    """Nodes and edges from a report dict; an edge through an inserted cast carries the cast."""
    d = Drawing()
    ops = data.get("ops") or []
    casts = {c.get("output"): c for c in data.get("casts") or [] if isinstance(c, Mapping) and c.get("output")}
    producer: dict[str, int] = {}
    for i in drawn(data):
        op = ops[i]
        producer.update((t, len(d.ops)) for t in op.get("outputs") or ())
        d.ops.append(op)
        d.index.append(i)
        d.labels.append(str(op.get("op_type") or "?"))
    d.hidden = len(ops) - len(d.ops)
    graph_inputs = {t.get("name") for t in data.get("tensors") or [] if t.get("kind") == "input"}
    inputs: dict[str, int] = {}

    def source(tensor: str) -> tuple[int | None, Mapping | None]:
        cast = casts.get(tensor)
        if cast is not None and cast.get("inserted", True):
            tensor = cast.get("tensor") or tensor
        else:
            cast = None
        if tensor in producer:
            return producer[tensor], cast
        if cast is None and tensor not in graph_inputs:
            return None, None  # a weight, or an op not drawn
        if tensor not in inputs:
            inputs[tensor] = _pseudo(d, tensor)
        return inputs[tensor], cast

    for v in range(len(d.ops)):
        for t in d.ops[v].get("inputs") or ():
            src, cast = source(t)
            if src is not None and src != v:
                d.edges.append(Edge(src, v, t, cast))
    for t in data.get("tensors") or []:
        if t.get("graph_output"):
            src, cast = source(t["name"])
            if src is not None:
                d.edges.append(Edge(src, _pseudo(d, t["name"], "output"), t["name"], cast))
    if len(d.ops) > MAX_DRAWN:
        d = _fold(d)
    _layout(d)
    return d


def _fold(d: Drawing) -> Drawing:
    """Each module group as one box, coloured by its commonest category; other ops stay as they are."""
    out = Drawing(hidden=d.hidden)
    where: list[int] = []
    boxes: dict[str, int] = {}
    for v, op in enumerate(d.ops):
        key = group_of(op) if op is not None else ""
        if key and key in boxes:
            out.ops[boxes[key]]["members"].append(op)
        elif key:
            boxes[key] = len(out.ops)
            out.ops.append({"name": key, "members": [op]})
            out.index.append(-1)
            out.labels.append(key)
        else:
            out.ops.append(op)
            out.index.append(d.index[v])
            out.labels.append(d.labels[v])
        where.append(boxes[key] if key else len(out.ops) - 1)
    for box in boxes.values():
        members = out.ops[box].pop("members")
        mix = _mix(members)
        out.ops[box].update({"op_type": f"{len(members)} ops", "category": mix[0][0],
                             "reason": ", ".join(f"{n} {CATEGORIES[c]}" for c, n in mix)})
        out.labels[box] = f"{out.labels[box].rsplit('/', 1)[-1]} · {len(members)} ops"
    edges: dict[tuple[int, int], Edge] = {}
    for e in d.edges:
        key = (where[e.src], where[e.dst])
        if key[0] != key[1] and (key not in edges or e.cast and not edges[key].cast):
            edges[key] = Edge(key[0], key[1], e.tensor, e.cast)
    out.edges = list(edges.values())
    out.folded = len(boxes)
    return out


def _mix(ops: list[Mapping[str, Any]]) -> list[tuple[str, int]]:
    """(category, count) of ``ops``, commonest first."""
    counts: dict[str, int] = {}
    for op in ops:
        counts[category(op)] = counts.get(category(op), 0) + 1
    return sorted(counts.items(), key=lambda kv: -kv[1])


def _pseudo(d: Drawing, tensor: str, kind: str = "input") -> int:
    d.ops.append(None)
    d.index.append(-1)
    d.labels.append(f"{kind}: {tensor}")
    return len(d.labels) - 1


def _layout(d: Drawing) -> None:
    n = len(d.labels)
    preds: list[list[int]] = [[] for _ in range(n)]
    for e in d.edges:
        preds[e.dst].append(e.src)
    row = [0] * n
    for v in _topo(n, preds):
        row[v] = 1 + max((row[p] for p in preds[v]), default=-1)
    first_use: dict[int, int] = {}
    for e in d.edges:
        first_use[e.src] = min(first_use.get(e.src, row[e.dst]), row[e.dst])
    for v in range(n):  # a source (input, op on weights only) sits just above its first reader
        if not preds[v] and v in first_use:
            row[v] = max(first_use[v] - 1, 0)
    rows: dict[int, list[int]] = {}
    for v in range(n):
        rows.setdefault(row[v], []).append(v)
    pos = [0.0] * n
    for members in rows.values():
        for k, v in enumerate(members):
            pos[v] = float(k)
    for _ in range(2):  # barycenter sweeps: each op near the mean column of what feeds it
        for r in sorted(rows):
            members = rows[r]
            members.sort(key=lambda v: (sum(pos[p] for p in preds[v]) / len(preds[v])) if preds[v] else pos[v])
            for k, v in enumerate(members):
                pos[v] = k - (len(members) - 1) / 2
    left = min(pos, default=0.0)
    d.xy = [(PAD + (pos[v] - left) * COL_W, PAD + row[v] * ROW_H) for v in range(n)]
    d.width = PAD * 2 + (max(pos, default=0.0) - left) * COL_W + NODE_W
    d.height = PAD * 2 + (max(row, default=0) + 1) * ROW_H


def _topo(n: int, preds: list[list[int]]) -> list[int]:
    """Kahn's order (input pseudo-nodes are numbered after the ops they feed)."""
    succs: list[list[int]] = [[] for _ in range(n)]
    missing = [len(p) for p in preds]
    for v, ps in enumerate(preds):
        for p in ps:
            succs[p].append(v)
    order = [v for v in range(n) if not missing[v]]
    for v in order:  # the list grows while it is read
        for w in succs[v]:
            missing[w] -= 1
            if not missing[w]:
                order.append(w)
    placed = set(order)  # folded groups can form a cycle (a module used twice): its members go last
    return order + [v for v in range(n) if v not in placed]


def render(data: Mapping[str, Any]) -> str:
    """The graph section of the HTML report (inline SVG and controls), or a note why it is absent."""
    ops = data.get("ops") or []
    head = '<section id="graph"><h2>Graph</h2>'
    if not ops:
        return head + '<p class="none">No ops to draw.</p></section>'
    if not any(isinstance(o, Mapping) and "inputs" in o for o in ops):
        return head + ('<p class="none">This report has no edges (schema 1.0): '
                       're-run amp-compile to draw the graph.</p></section>')
    d = build(data)
    if len(d.ops) > MAX_DRAWN:
        grouped = f" in {d.folded:,} module groups and single ops" if d.folded else ""
        return head + (f'<p class="none">{len(ops):,} ops{grouped}: more than the {MAX_DRAWN:,} boxes the drawing '
                       'shows; the table and charts below cover every op.</p></section>')
    note = (f'<p class="meta">{d.hidden:,} ops without float data (shape arithmetic, integer constants) are '
            'not drawn; the table lists them.</p>' if d.hidden else "")
    if d.folded:
        note += (f'<p class="meta">Over {MAX_DRAWN:,} ops: each of the {d.folded:,} module groups is one box, '
                 'coloured by its commonest precision; click one to filter the table to it.</p>')
    return (head + _legend() + note + _toolbar() + _svg(d)
            + '<div id="g-info" class="g-info"></div></section>')


def html_views(data: Mapping[str, Any]) -> str:
    """The report's pictures: the graph and where the time and memory go, with their CSS
    (``GRAPH_JS`` goes into the page's one script element)."""
    from .report_charts import render as render_charts

    return f"<style>{GRAPH_CSS}</style>{render(data)}{render_charts(data)}"


def _legend() -> str:
    items = "".join(f'<span class="g-key"><svg width="14" height="12"><rect class="g-{k}" width="14" height="12" '
                    f'rx="3"/></svg> {html.escape(v)}</span>' for k, v in CATEGORIES.items())
    return (f'<p class="g-legend">{items}<span class="g-key"><svg width="30" height="12"><path class="g-edge '
            'g-cast" d="M0 6H30"/></svg> inserted cast</span></p>')


def _toolbar() -> str:
    return ('<p class="g-tools" hidden><input id="g-search" type="search" placeholder="find op (name or type), '
            'Enter for next" aria-label="find op in graph"> <button data-g="in">+</button>'
            '<button data-g="out">−</button><button data-g="fit">fit</button>'
            '<button data-g="collapse">collapse groups</button><button data-g="expand">expand groups</button>'
            ' <span id="g-found"></span></p>')


def _svg(d: Drawing) -> str:
    e = html.escape
    out = [f'<div class="g-view"><svg id="g-svg" '
           f'viewBox="0 0 {d.width:.0f} {d.height:.0f}" data-w="{d.width:.0f}" data-h="{d.height:.0f}" '
           'role="img" aria-label="op graph coloured by precision">']
    out += _groups(d)
    for edge in d.edges:
        path, (mx, my) = _route(d.xy[edge.src], d.xy[edge.dst])
        ends = f'data-s="{edge.src}" data-d="{edge.dst}"'
        if edge.cast is None:
            out.append(f'<path class="g-edge" {ends} d="{path}"/>')
            continue
        c = edge.cast
        tip = f"cast {c.get('from')} → {c.get('to')} of {c.get('tensor')} ({c.get('name')}): {c.get('reason') or ''}"
        to = category({"precision": c.get("to")})
        out.append(f'<g class="g-castedge" {ends}><title>{e(tip)}</title><path class="g-edge g-cast" d="{path}"/>'
                   f'<rect class="g-{to} g-castmark" x="{mx - 5:.0f}" y="{my - 5:.0f}" width="10" height="10" '
                   f'transform="rotate(45 {mx:.0f} {my:.0f})"/></g>')
    for v, label in enumerate(d.labels):
        x, y = d.xy[v]
        op = d.ops[v]
        if op is None:
            out.append(f'<g class="g-io" transform="translate({x:.0f},{y:.0f})"><title>{e(label)}</title>'
                       f'<rect width="{NODE_W}" height="{NODE_H}" rx="13"/>'
                       f'<text x="{NODE_W / 2:.0f}" y="17">{e(_short(label, 20))}</text></g>')
            continue
        i = d.index[v]
        if i < 0:  # a folded module group
            cat, tip, link = op["category"], f"{op['name']}: {op['op_type']} ({op['reason']})", "data-filter"
        else:
            cat, link = category(op), f'id="g-op-{i}" data-i'
            tip = (f"{op.get('name')}\n{op.get('op_type')} · {op.get('class')} · {op.get('precision')}\n"
                   f"{op.get('reason') or ''}")
        target = e(str(op["name"])) if i < 0 else i
        out.append(f'<g class="g-n g-{cat}" {link}="{target}" data-grp="{e(group_of(op)) if i >= 0 else ""}" '
                   f'data-find="{e(str(op.get("name") or "").lower())} {e(label.lower())}" '
                   f'transform="translate({x:.0f},{y:.0f})"><title>{e(tip)}</title>'
                   f'<rect width="{NODE_W}" height="{NODE_H}" rx="4"/>'
                   f'<text x="{NODE_W / 2:.0f}" y="17">{e(_short(label, 18))}</text></g>')
    out.append("</svg></div>")
    return "".join(out)


def _route(a: tuple[float, float], b: tuple[float, float]) -> tuple[str, tuple[float, float]]:
    """An edge's SVG path and its midpoint: bottom to top between adjacent rows; an edge that
    skips rows (a residual) leaves and enters on the right and bows into the gap between columns,
    so it never runs through the ops of its own column."""
    (x1, y1), (x2, y2) = a, b
    if y2 - y1 <= ROW_H:
        x1, x2, y1 = x1 + NODE_W / 2, x2 + NODE_W / 2, y1 + NODE_H
        bend = (y2 - y1) / 2
        return (f"M{x1:.0f} {y1:.0f}C{x1:.0f} {y1 + bend:.0f} {x2:.0f} {y2 - bend:.0f} {x2:.0f} {y2:.0f}",
                ((x1 + x2) / 2, (y1 + y2) / 2))
    x1, x2, y1, y2 = x1 + NODE_W, x2 + NODE_W, y1 + NODE_H / 2, y2 + NODE_H / 2
    bow = (COL_W - NODE_W) * 0.9 / 0.75  # a cubic reaches 3/4 of its control points' offset
    return (f"M{x1:.0f} {y1:.0f}C{x1 + bow:.0f} {y1:.0f} {x2 + bow:.0f} {y2:.0f} {x2:.0f} {y2:.0f}",
            ((x1 + x2) / 2 + 0.75 * bow, (y1 + y2) / 2))


def _groups(d: Drawing) -> list[str]:
    """A labelled box behind each module group of two or more ops (the unit the script collapses)."""
    boxes: dict[str, list[int]] = {}
    for v, op in enumerate(d.ops):
        if d.index[v] >= 0 and group_of(op):  # not pseudo-nodes, nor groups folded into one box
            boxes.setdefault(group_of(op), []).append(v)
    out = []
    for name, members in boxes.items():
        if len(members) < 2:
            continue
        xs = [d.xy[v][0] for v in members]
        ys = [d.xy[v][1] for v in members]
        x0, y0, x1, y1 = min(xs) - 8, min(ys) - 18, max(xs) + NODE_W + 8, max(ys) + NODE_H + 8
        cats: dict[str, int] = {}
        for v in members:
            cats[CATEGORIES[category(d.ops[v])]] = cats.get(CATEGORIES[category(d.ops[v])], 0) + 1
        mix = ", ".join(f"{n} {k}" for k, n in sorted(cats.items(), key=lambda kv: -kv[1]))
        label = html.escape(f"{name}: {len(members)} ops ({mix})")
        out.append(f'<g class="g-grp" data-grp="{html.escape(name)}"><title>{label}</title>'
                   f'<rect x="{x0:.0f}" y="{y0:.0f}" width="{x1 - x0:.0f}" height="{y1 - y0:.0f}" rx="6"/>'
                   f'<text x="{x0 + 6:.0f}" y="{y0 + 12:.0f}">{html.escape(_short(name, 48))} · '
                   f'{len(members)} ops</text></g>')
    return out


def _short(s: str, n: int) -> str:
    return s if len(s) <= n else s[:n - 1] + "…"


GRAPH_CSS = """
.g-legend{display:flex;flex-wrap:wrap;gap:12px;color:var(--muted);font-size:12px}.g-key svg{vertical-align:middle}
.g-view{height:min(80vh,900px);border:1px solid var(--line);border-radius:8px;background:#fff;overflow:hidden;
cursor:grab}
#g-svg{width:100%;height:100%;display:block;font:11px system-ui,sans-serif}
.g-n rect,.g-io rect,.g-castmark{stroke:#0003;stroke-width:1}.g-n{cursor:pointer}
.g-n text,.g-io text{text-anchor:middle;fill:#1d232b}
.g-fp16{fill:#7fd39a}.g-bf16{fill:#80c8dd}.g-fp32-rule{fill:#f5a35c}.g-fp32-cost{fill:#ffd9a8}
.g-unknown{fill:#f28b82}.g-none{fill:#d5dae0}.g-io rect{fill:#fff;stroke-dasharray:3 2}
.g-edge{fill:none;stroke:#8b95a1;stroke-width:1.2}.g-edge.g-cast{stroke:#7b3fe4;stroke-width:2;stroke-dasharray:5 3}
.g-grp rect{fill:#f3f5f8;stroke:#c9d0d8}.g-grp text{fill:var(--muted);font-size:10px}
.g-grp.collapsed rect{fill:#e3e8ee;stroke:#6e7781;stroke-width:1.5}.g-grp.collapsed text{font-size:12px;fill:var(--fg)}
.g-hide{display:none}.g-dim{opacity:.25}.g-hit rect{stroke:#d00;stroke-width:3}
.g-focus rect{stroke:#7b3fe4;stroke-width:4}
td.name{cursor:pointer}
tr.g-sel td{outline:2px solid #7b3fe4}.g-info{color:var(--muted);min-height:1.4em;margin-top:6px;white-space:pre-wrap}
"""

# Structure only; every model string is already escaped in the SVG's attributes. It runs once the
# page is parsed: the op table (row ids for click-to-row) comes after the graph.
GRAPH_JS = """
document.addEventListener("DOMContentLoaded",function(){var svg=document.getElementById("g-svg");if(!svg)return;
var tools=document.querySelector(".g-tools");tools.hidden=false;
var W=+svg.dataset.w,H=+svg.dataset.h,vb;
function set(b){vb=b;svg.setAttribute("viewBox",b.join(" "));}
function aspect(){var r=svg.getBoundingClientRect();return Math.max(r.height,1)/Math.max(r.width,1);}
function top(){var w=Math.max(W,svg.getBoundingClientRect().width/0.75);set([(W-w)/2,0,w,w*aspect()]);}
function fit(){var a=aspect(),w=Math.max(W,H/a);set([(W-w)/2,0,w,w*a]);}
function zoom(f,cx,cy){cx=cx===undefined?vb[0]+vb[2]/2:cx;cy=cy===undefined?vb[1]+vb[3]/2:cy;
 set([cx-(cx-vb[0])*f,cy-(cy-vb[1])*f,vb[2]*f,vb[3]*f]);}
function pt(ev){var r=svg.getBoundingClientRect();return [vb[0]+(ev.clientX-r.left)*vb[2]/r.width,
 vb[1]+(ev.clientY-r.top)*vb[3]/r.height];}
top();
svg.addEventListener("wheel",function(ev){ev.preventDefault();var p=pt(ev);zoom(ev.deltaY>0?1.15:1/1.15,p[0],p[1]);},
 {passive:false});
var drag=null;svg.addEventListener("mousedown",function(ev){drag=[ev.clientX,ev.clientY,vb.slice()];});
window.addEventListener("mouseup",function(){drag=null;});
window.addEventListener("mousemove",function(ev){if(!drag)return;var r=svg.getBoundingClientRect();
 set([drag[2][0]-(ev.clientX-drag[0])*vb[2]/r.width,drag[2][1]-(ev.clientY-drag[1])*vb[3]/r.height,vb[2],vb[3]]);});
function center(g){var t=g.transform.baseVal.consolidate().matrix;set([t.e-vb[2]/2,t.f-vb[3]/2,vb[2],vb[3]]);}
var table=document.getElementById("ops");
if(table){Array.prototype.forEach.call(table.tBodies[0].rows,function(r){r.id="op-"+r.cells[0].textContent;});
 table.tBodies[0].addEventListener("click",function(ev){var td=ev.target.closest("td.name");if(!td)return;
  var g=document.getElementById("g-op-"+td.parentNode.cells[0].textContent);
  if(!g||g.classList.contains("g-hide"))return;
  svg.querySelectorAll(".g-focus").forEach(function(x){x.classList.remove("g-focus");});
  g.classList.add("g-focus");center(g);svg.scrollIntoView({block:"center"});});}
var info=document.getElementById("g-info");
svg.querySelectorAll(".g-n").forEach(function(g){g.addEventListener("click",function(){
 info.textContent=g.querySelector("title").textContent;var f=document.getElementById("op-filter");
 if(g.dataset.filter!==undefined&&f){f.value=g.dataset.filter;f.dispatchEvent(new Event("input"));
  f.scrollIntoView({block:"center"});return;}
 var row=document.getElementById("op-"+g.dataset.i);if(!row)return;
 document.querySelectorAll("tr.g-sel").forEach(function(r){r.classList.remove("g-sel");});
 row.classList.add("g-sel");row.style.display="";row.scrollIntoView({block:"center"});});});
var nodes=Array.prototype.slice.call(svg.querySelectorAll(".g-n")),hits=[],at=0,
 found=document.getElementById("g-found"),box=document.getElementById("g-search");
box.addEventListener("input",function(){var q=box.value.toLowerCase().trim();hits=[];at=0;
 nodes.forEach(function(g){var ok=q&&g.dataset.find.indexOf(q)>=0;g.classList.toggle("g-hit",!!ok);
  g.classList.toggle("g-dim",!!q&&!ok);if(ok)hits.push(g);});
 found.textContent=q?hits.length+" found":"";if(hits.length)center(hits[0]);});
box.addEventListener("keydown",function(ev){if(ev.key==="Enter"&&hits.length){at=(at+1)%hits.length;center(hits[at]);
 found.textContent=(at+1)+" of "+hits.length;}});
function collapse(grp,on){var sel='[data-grp="'+CSS.escape(grp.dataset.grp)+'"]';
 grp.classList.toggle("collapsed",on);if(on)svg.appendChild(grp);else svg.insertBefore(grp,svg.firstChild);
 svg.querySelectorAll(".g-n"+sel).forEach(function(g){g.classList.toggle("g-hide",on);});}
svg.querySelectorAll(".g-grp").forEach(function(grp){grp.addEventListener("click",function(ev){
 collapse(grp,!grp.classList.contains("collapsed"));ev.stopPropagation();});});
tools.addEventListener("click",function(ev){var a=ev.target.dataset.g;if(!a)return;
 if(a==="in")zoom(1/1.3);if(a==="out")zoom(1.3);if(a==="fit")fit();
 if(a==="collapse"||a==="expand")svg.querySelectorAll(".g-grp").forEach(function(g){collapse(g,a==="collapse");});});
});
"""

__all__ = ["CATEGORIES", "GRAPH_CSS", "GRAPH_JS", "Drawing", "build", "category", "drawn", "group_of", "html_views",
           "render"]
