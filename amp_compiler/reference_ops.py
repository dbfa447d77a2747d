"""Corrected op implementations for ONNX's reference evaluator (``validate.run_reference``).

onnx 1.23's GatherElements goes through ``np.choose``, which takes at most 32 choices; past
that it falls back to a helper that reads one element per row, so every transformers BERT
(``token_type_ids`` gathered from a [1, 512] buffer) failed ``--runtime reference`` with
"cannot reshape array of size 1 into shape (1, 2)". docs/architecture.md, "Numerics".
"""

from __future__ import annotations

import numpy as np
from onnx.reference.op_run import OpRun


class GatherElements(OpRun):
    """ONNX GatherElements: ``np.take_along_axis`` with negative indices counted from the end."""

    op_domain = ""

    def _run(self, data, indices, axis=None):
        axis = 0 if axis is None else int(axis)
        idx = np.asarray(indices).astype(np.int64)
        idx = np.where(idx < 0, idx + data.shape[axis], idx)
        return (np.take_along_axis(data, idx, axis=axis),)


#: what ``run_reference`` passes as ``new_ops``: each overrides onnx's own implementation
REFERENCE_FIXES = [GatherElements]
