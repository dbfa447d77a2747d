"""The HTML report's inline stylesheet and script (structure only: no report data goes in the script).

docs/architecture.md, "Report".
"""

CSS = """
:root{--fg:#1d232b;--muted:#5d6875;--bg:#f6f7f9;--card:#fff;--line:#dde1e6;
--fp16:#1a7f37;--fp16bg:#dcf5e3;--bf16:#0b6e8a;--bf16bg:#d7eff6;--fp32:#b35900;--fp32bg:#ffe9d1;
--na:#6e7781;--nabg:#eceff2;--bad:#b42318;--badbg:#fde4e1}
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--fg);background:var(--bg)}
header{padding:18px 24px 8px}h1{font-size:20px;margin:0 0 4px;word-break:break-all}
.meta{color:var(--muted);margin:0}main{padding:0 24px 32px}
h2{font-size:16px;margin:24px 0 8px}.count{color:var(--muted);font-weight:normal}
.cards{display:flex;flex-wrap:wrap;gap:12px;margin-top:12px}
.card{background:var(--card);border:1px solid var(--line);border-radius:8px;padding:10px 14px;min-width:170px}
.card .label{color:var(--muted);font-size:12px;text-transform:uppercase;letter-spacing:.04em}
.card .value{font-size:22px;font-weight:600}.card .sub{color:var(--muted);font-size:12px}
.card.ok{border-color:var(--fp16)}.card.bad{border-color:var(--bad);background:var(--badbg)}
table{border-collapse:collapse;background:var(--card);border:1px solid var(--line);width:100%}
th,td{padding:4px 8px;border-bottom:1px solid var(--line);text-align:left;vertical-align:top}
th{background:#eef1f4;position:sticky;top:0;white-space:nowrap}
table.sortable th{cursor:pointer}th.asc::after{content:" \\25B2"}th.desc::after{content:" \\25BC"}
td.num{text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums}
td.name{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12px;word-break:break-all}
td.reason{color:#333;min-width:18em}
table.classes{width:auto}td.barcell{min-width:220px}
.bar{display:flex;height:12px;background:var(--nabg);border-radius:3px;overflow:hidden}
.seg.p-fp16{background:var(--fp16)}.seg.p-bf16{background:var(--bf16)}.seg.p-fp32{background:var(--fp32)}
.seg.p-na,.seg.p-other{background:#aab2bb}
.prec,.cls{display:inline-block;padding:0 6px;border-radius:10px;font-size:12px;white-space:nowrap}
.prec.p-fp16{color:var(--fp16);background:var(--fp16bg)}.prec.p-bf16{color:var(--bf16);background:var(--bf16bg)}
.prec.p-fp32{color:var(--fp32);background:var(--fp32bg);font-weight:600}
.prec.p-na,.prec.p-other{color:var(--na);background:var(--nabg)}
.cls{border:1px solid var(--line)}.cls-deny{border-color:var(--fp32)}.cls-unknown{border-color:var(--bad);color:var(--bad)}
tr.p-fp32 td{background:#fff8f0}
.ok{color:var(--fp16)}.bad{color:var(--bad);font-weight:600}.status{font-size:14px}
.warn{background:var(--badbg);border:1px solid var(--bad);border-radius:6px;padding:6px 10px}
.none{color:var(--muted)}.tools{margin:4px 0 8px}#op-filter{width:28em;max-width:100%;padding:4px 8px}
#op-shown{color:var(--muted)}
"""

# Only structure, never report data, goes into the script (data lives in escaped HTML).
JS = """
(function(){
function key(td,type){if(!td)return type==="num"?-Infinity:"";
 if(type==="num"){var s=td.getAttribute("data-sort");var v=s===null?parseFloat(td.textContent):parseFloat(s);
  return isNaN(v)?-Infinity:v;}return td.textContent.toLowerCase();}
document.querySelectorAll("table.sortable").forEach(function(t){
 var ths=t.tHead.rows[0].cells;
 Array.prototype.forEach.call(ths,function(th,i){th.addEventListener("click",function(){
  var asc=!th.classList.contains("asc");
  Array.prototype.forEach.call(ths,function(h){h.classList.remove("asc","desc");});
  th.classList.add(asc?"asc":"desc");var type=th.getAttribute("data-type");var body=t.tBodies[0];
  var rows=Array.prototype.map.call(body.rows,function(r,j){return [key(r.cells[i],type),j,r];});
  rows.sort(function(a,b){return a[0]<b[0]?(asc?-1:1):a[0]>b[0]?(asc?1:-1):a[1]-b[1];});
  var f=document.createDocumentFragment();rows.forEach(function(x){f.appendChild(x[2]);});body.appendChild(f);
 });});});
var inp=document.getElementById("op-filter"),ops=document.getElementById("ops"),
 shown=document.getElementById("op-shown");
if(inp&&ops){inp.hidden=false;var timer=null;
 function apply(){var terms=inp.value.toLowerCase().split(/\\s+/).filter(Boolean),n=0,rows=ops.tBodies[0].rows;
  for(var i=0;i<rows.length;i++){var txt=rows[i].textContent.toLowerCase(),ok=true;
   for(var k=0;k<terms.length;k++){if(txt.indexOf(terms[k])<0){ok=false;break;}}
   rows[i].style.display=ok?"":"none";if(ok)n++;}
  shown.textContent=terms.length?(n+" of "+rows.length+" ops shown"):"";}
 inp.addEventListener("input",function(){clearTimeout(timer);timer=setTimeout(apply,120);});}
})();
"""
