"""Per-op precision report (schema in docs/report-schema.md): the ``Report`` object and its text, HTML and JSON renderings.

Modules: ``schema`` (version, key order, JSON), ``formatting`` (units, clean text),
``text_table`` (the terminal table engine), ``text`` and ``html_page`` (the two
renderers; ``html_assets`` holds the page's CSS and JS), ``document`` (``Report``).
The report dict itself is built by ``plan_report.build_report``. docs/architecture.md, "Report".
"""

from .document import Report
from .formatting import fmt_bytes, fmt_count, fmt_flops, fmt_pct, fmt_sci, fmt_speedup, fmt_time
from .schema import SAVE_FORMATS, SCHEMA_VERSION

__all__ = ["SAVE_FORMATS", "SCHEMA_VERSION", "Report", "fmt_bytes", "fmt_count", "fmt_flops", "fmt_pct",
           "fmt_sci", "fmt_speedup", "fmt_time"]
