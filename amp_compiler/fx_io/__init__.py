"""The FX path: capture an aten-level FX graph, import it into the IR, emit the plan back.

``capture`` gets the graph (``torch.export`` for ``amp_compiler.compile``, ``make_fx``
over dynamo's graph for the ``torch.compile`` backend), ``importer`` builds the
``PrecisionGraph``, ``emitter`` writes the planned casts and folded weights into the
``GraphModule``. Importing this package imports torch.
"""
