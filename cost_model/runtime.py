"""Runtime profiles: what the deployment runtime fuses, and what a kernel launch costs there.

The planner prices *kernels*, not ops: a runtime that fuses an elementwise chain into one
kernel pays one launch for it, and its intermediates never reach memory (see
``cost_model/fusion.py``, which forms the groups, and ``docs/architecture.md``, "Runtime
profiles"). A profile says which producer -> consumer edges the runtime fuses, by op kind:

* ``gemm`` tensor-core ops, ``pointwise`` elementwise math (and existing casts),
  ``reduction`` (reduce ops, cumulative sums), ``norm`` (LayerNorm/RMSNorm/BatchNorm/...),
  ``softmax``, ``movement`` (transpose, concat, slice, gather, pad, ...), ``alias``
  (views: reshape, squeeze, ...: no kernel of their own), ``other``;
* whether inserted casts fold into a neighbour's kernel (``fuse_casts``): then a cast costs
  its memory traffic but no launch;
* ``launch_scale``: the fraction of the device's launch overhead each kernel pays (CUDA
  graphs replay a whole graph with one launch; ``< 1`` models that).

Sources, per profile (behaviour as documented by each project):

* ``eager`` -- PyTorch eager mode dispatches one kernel per aten op; nothing fuses.
* ``ort-cuda`` -- ONNX Runtime's CUDA EP with its default graph optimisations, as measured on an
  H100 with ONNX Runtime 1.31 (``benchmarks/README.md``, "GPU suite": the census of what each
  zoo model ran). It has no general elementwise fuser, and a ``Cast`` node is a kernel of its
  own. What fused there: MatMul + bias -> Gemm, residual add + LayerNorm -> SkipLayerNorm,
  tanh-GELU -> FastGelu, written-out RMSNorms -> SimplifiedLayerNorm. What did not: erf-GELU
  (Erf, Div, Mul, Add stay four kernels in dynamo exports) and attention (MatMul, Softmax,
  MatMul stay three: the Attention fusion lives in the offline transformers optimizer, not the
  session). So pointwise chains fuse only around a tanh/sigmoid-style anchor, GEMM epilogues are
  bias then an activation, and a GEMM never shares a kernel with a softmax. CUDA graphs are
  opt-in (``enable_cuda_graph``), so launches are not amortised. FP32 GEMMs run as TF32 there;
  the planner still prices them at the FP32 CUDA-core rate (see the README's GPU section for why
  that is left as it is).
  *Decomposed* LayerNorm chains (ReduceMean ... Div, Mul) are left unfused here, on purpose:
  ORT's LayerNormFusion absorbs a leading FP16->FP32 Cast into the pattern and then builds an
  ill-typed LayerNormalization (FP16 input, FP32 scale), so a plan priced on that fusion (FP32
  norm behind a widening cast) failed to load; unfused pricing is conservative. Decomposed
  RMSNorms fuse, with the casts around them (``fuses_rms_norm``, ``cost_model/norm_pattern.py``):
  SimplifiedLayerNormFusion builds a kernel typed for mixed input and output.
* ``tensorrt`` -- TensorRT's layer fusion catalog (docs.nvidia.com/deeplearning/tensorrt,
  "Layer Fusion Catalog"): convolution/FullyConnected + bias + activation + element-wise
  sum, PointWise fusion of elementwise chains, normalisation and MHA fusion, and reformat
  (precision-conversion) layers fused into their neighbours.
* ``inductor`` -- TorchInductor's scheduler (pytorch ``torch/_inductor/scheduler.py``): it
  fuses pointwise ops with each other and into reductions (softmax, norms) and their
  epilogues; casts are pointwise (``to_dtype`` inside the Triton kernel); GEMMs and
  convolutions are extern cuBLAS/cuDNN kernels by default (``extern_kernels.mm``, no
  epilogue fusion without ``max_autotune`` templates); attention becomes SDPA.
* ``inductor-cudagraphs`` -- the same with ``mode="reduce-overhead"`` (CUDA graphs: the
  per-kernel launch cost mostly disappears; 0.25 of a launch is kept for the GPU-side gap
  between kernels).

Defaults per entry point (``default_runtime``): the ONNX path deploys on ONNX Runtime's
CUDA EP (what a ``.onnx`` file on a GPU most often runs on); ``amp_compiler.compile`` and
the ``torch.compile`` backend use ``inductor`` when their backend is inductor, else
``eager`` (the emitted GraphModule runs op by op).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RuntimeProfile", "RUNTIMES", "get_runtime", "default_runtime", "KINDS"]

KINDS = ("gemm", "pointwise", "reduction", "norm", "softmax", "movement", "alias", "cast", "other")

_PW = "pointwise"


@dataclass(frozen=True)
class RuntimeProfile:
    """What one deployment runtime fuses and what its launches cost; see module docstring."""

    name: str
    summary: str
    fused_edges: frozenset[tuple[str, str]]  # (producer kind, consumer kind) fused into one kernel
    fuse_casts: bool  # inserted casts fold into a neighbour: traffic, no launch
    launch_scale: float = 1.0  # fraction of the device launch overhead paid per kernel
    max_pointwise: int = 1 << 30  # cap on pointwise ops per fused kernel (pattern-sized for ORT)
    max_gemms: int = 1  # tensor-core ops per kernel (2: attention, QK^T and PV in one kernel)
    #: if set, a group of pointwise ops alone (no GEMM, norm or softmax) fuses only when it holds
    #: one of these canonical ops: a pattern fuser (ORT's GELU/FastGelu/Swish), not a general one
    pointwise_anchors: frozenset[str] = frozenset()
    #: if set, the only pointwise ops a GEMM/conv epilogue takes (ORT: bias, then an activation)
    epilogue_ops: frozenset[str] = frozenset()
    max_epilogue: int = 1 << 30  # pointwise ops a group holding a GEMM/conv may take
    #: decomposed RMSNorms (with their boundary casts) run as one kernel: cost_model/norm_pattern.py
    fuses_rms_norm: bool = False

    def fuses(self, producer_kind: str, consumer_kind: str) -> bool:
        return (producer_kind, consumer_kind) in self.fused_edges


def _edges(*pairs: str) -> frozenset[tuple[str, str]]:
    out = set()
    for pair in pairs:
        a, _, b = pair.partition(">")
        out.add((a.strip(), b.strip()))
    return frozenset(out)


RUNTIMES: dict[str, RuntimeProfile] = {
    "eager": RuntimeProfile("eager", "PyTorch eager: one kernel per op, every cast a kernel", frozenset(),
                            fuse_casts=False),
    "ort-cuda": RuntimeProfile(
        "ort-cuda", "ONNX Runtime CUDA EP: GEMM bias/activation epilogues, FastGelu, LayerNorm/SkipLayerNorm "
                    "and RMSNorm fusions (no attention or erf-GELU fusion); casts are kernels; no CUDA graphs",
        _edges("gemm>pointwise", "pointwise>pointwise", "pointwise>norm"),
        fuse_casts=False, max_pointwise=8, max_gemms=1,
        pointwise_anchors=frozenset({"tanh", "sigmoid", "gelu", "swish", "softplus"}),
        epilogue_ops=frozenset({"add", "relu", "leaky_relu", "gelu", "sigmoid", "tanh", "swish", "clip"}),
        max_epilogue=2, fuses_rms_norm=True),
    "tensorrt": RuntimeProfile(
        "tensorrt", "TensorRT: PointWise fusion, GEMM/conv + bias + activation + residual, norm and MHA "
                    "fusion, precision reformats fused into neighbours",
        _edges("gemm>pointwise", "pointwise>pointwise", "pointwise>norm", "norm>pointwise",
               "pointwise>reduction", "reduction>pointwise", "gemm>softmax", "pointwise>softmax",
               "softmax>gemm"),
        fuse_casts=True, max_gemms=2),
    "inductor": RuntimeProfile(
        "inductor", "TorchInductor: pointwise chains, reductions with their prologues/epilogues, casts "
                    "in Triton kernels; GEMMs/convs are extern kernels; no CUDA graphs",
        _edges("pointwise>pointwise", "pointwise>reduction", "reduction>pointwise", "pointwise>norm",
               "norm>pointwise", "pointwise>softmax", "softmax>pointwise", "movement>pointwise",
               "pointwise>movement", "reduction>reduction"),
        fuse_casts=True),
}
RUNTIMES["inductor-cudagraphs"] = RuntimeProfile(
    "inductor-cudagraphs", "TorchInductor with mode='reduce-overhead': as inductor, launches replayed "
                           "from a CUDA graph",
    RUNTIMES["inductor"].fused_edges, fuse_casts=True, launch_scale=0.25)


def get_runtime(name: str | RuntimeProfile) -> RuntimeProfile:
    """The profile called ``name``; ValueError listing the known ones."""
    if isinstance(name, RuntimeProfile):
        return name
    try:
        return RUNTIMES[str(name).lower()]
    except KeyError:
        raise ValueError(f"unknown runtime profile {name!r}: use one of {', '.join(RUNTIMES)}") from None


def default_runtime(entry: str, backend: str | None = None) -> str:
    """The profile an entry point plans for when the user names none (see module docstring)."""
    if entry == "onnx":
        return "ort-cuda"
    return "inductor" if backend == "inductor" else "eager"
