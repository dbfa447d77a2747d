"""The op registry: one table of canonical ops, with an ONNX column and an aten column.

Each row gives a canonical op its class, which the ONNX schemas and the torch op
schemas cannot tell (they say which dtypes an op *accepts*, not whether FP16 is
numerically safe or fast for it):

* ``allow``  -- tensor-core ops (GEMM, conv, attention): FP16 makes them fast;
* ``infer``  -- numerically safe in FP16 given FP16 inputs (elementwise math,
  activations, means, and normalisations/softmax whose kernels accumulate in FP32);
* ``clear``  -- data movement; the precision of the data passes through;
* ``deny``   -- numerically unsafe in FP16 (exp, log, pow, sum/product reductions,
  losses, random generators, quantisation boundaries).

Which ports of an op are float, which must agree, and which accept any dtype is
derived from the ONNX schemas (``onnx_io.schemas``) or the tensors' dtypes; rows
here only add what the schemas cannot say: FP32-only ports, attributes that
carry a dtype, the FLOP formula, and whether the kernel accumulates in FP32.
"""

from __future__ import annotations

from dataclasses import dataclass, field

ALLOW, INFER, CLEAR, DENY, UNKNOWN = "allow", "infer", "clear", "deny", "unknown"
CLASSES = (ALLOW, INFER, CLEAR, DENY, UNKNOWN)


@dataclass(frozen=True)
class OpDef:
    """What the registry knows about one canonical op."""

    canonical: str
    op_class: str
    flops: str = "elementwise"  # formula name in ``cost_model.flops``
    flops_per_element: float = 1.0
    #: memory traffic: "all" (every input read, every output written), "gather" (reads from
    #: input 0 only as many elements as it writes: a lookup in a big table is not a scan of
    #: it) or "alias" (a view: moves no data)
    traffic: str = "all"
    tensor_core: bool = False
    accumulates_fp32: bool = False
    #: ports that stay FP32 whatever the op's precision (by port index)
    fp32_inputs: tuple[int, ...] = ()
    fp32_outputs: tuple[int, ...] = ()
    #: attributes that carry the output dtype (rewritten when the op changes precision)
    dtype_attrs: tuple[str, ...] = ()
    #: attribute values that make the op numerically unsafe in FP16: (attribute, values, why);
    #: such an op is ``deny`` whatever its row's class
    deny_attrs: tuple[tuple[str, tuple, str], ...] = ()
    #: attribute values that make the op compute (so ``infer``, not ``clear``): (attribute, values, why)
    infer_attrs: tuple[tuple[str, tuple, str], ...] = ()
    #: why the op must stay FP32 although its schema accepts FP16 (no runtime kernel), if so
    fp32_only: str = ""
    #: inputs that take the op's precision although the schema gives them a type parameter of
    #: their own (the schema's type inference ties them to the output)
    unit_inputs: tuple[int, ...] = ()
    note: str = ""  # why the op has its class; shown in reports
    onnx: tuple[str, ...] = ()  # "Op" (default domain) or "domain::Op"
    aten: tuple[str, ...] = ()  # aten overload packets, e.g. "mm", "addmm"


_ROWS: list[OpDef] = []


def _op(canonical: str, op_class: str, onnx=(), aten=(), **kw) -> None:
    _ROWS.append(OpDef(canonical, op_class, onnx=tuple(onnx), aten=tuple(aten), **kw))


def _many(op_class: str, names: str, **kw) -> None:
    """Rows whose canonical name is the snake_case of the ONNX op (aten overloads by the same name)."""
    for name in names.split():
        onnx_name, _, aten = name.partition("/")
        _op(_snake(onnx_name), op_class, onnx=[onnx_name], aten=[a for a in aten.split(",") if a], **kw)


def _snake(name: str) -> str:
    out = []
    for i, ch in enumerate(name):
        if ch.isupper() and i and (not name[i - 1].isupper() or (i + 1 < len(name) and name[i + 1].islower())):
            out.append("_")
        out.append(ch.lower())
    return "".join(out)


MS = "com.microsoft::"

# -- allow: tensor-core work -----------------------------------------------------------------------
_op("matmul", ALLOW, ["MatMul", MS + "FusedMatMul"], ["mm", "bmm", "matmul", "mv", "dot", "vdot"], flops="matmul",
    tensor_core=True)
_op("gemm", ALLOW, ["Gemm", MS + "FusedGemm"], ["addmm", "baddbmm", "linear", "addmv"], flops="gemm", tensor_core=True)
_op("batch_reduce_gemm", ALLOW, [], ["addbmm"], flops="einsum", tensor_core=True,
    note="a sum of batched GEMMs (one cuBLAS call)")
_op("conv", ALLOW, ["Conv", MS + "FusedConv"], ["convolution", "conv1d", "conv2d", "conv3d"], flops="conv", tensor_core=True)
_op("conv_tbc", ALLOW, [], ["conv_tbc"], flops="einsum", tensor_core=True,
    note="time-batch-channel 1-D convolution: a GEMM per kernel tap")
_op("conv_transpose", ALLOW, ["ConvTranspose"], ["conv_transpose1d", "conv_transpose2d"], flops="conv_transpose", tensor_core=True)
_op("einsum", ALLOW, ["Einsum"], ["einsum"], flops="einsum", tensor_core=True)
_op("attention", ALLOW, ["Attention", MS + "Attention", MS + "MultiHeadAttention", MS + "GroupQueryAttention",
                          MS + "PackedAttention", MS + "DecoderMaskedMultiHeadAttention"],
    ["scaled_dot_product_attention", "_scaled_dot_product_attention_math", "_native_multi_head_attention"],
    flops="attention", tensor_core=True, note="attention kernels accumulate in FP32")
# the fused kernels (a training step traces them undecomposed): output 1 is the softmax's logsumexp, which they
# write in FP32 whatever the inputs' dtype and their backward reads (ONNX Attention's output 1 is a cache)
_op("fused_attention", ALLOW, [],
    ["_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_for_cpu",
     "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
     "_scaled_dot_product_fused_attention_overrideable", "_efficient_attention_forward", "_flash_attention_forward",
     "_cudnn_attention_forward"],
    flops="attention", tensor_core=True, fp32_outputs=(1,),
    note="attention kernels accumulate in FP32; their logsumexp (output 1) stays FP32")
# the fused kernels' backward (a training step): grad_out, q, k, v, [attn_bias,] out, logsumexp, ...
_op("attention_backward", ALLOW, [], ["_scaled_dot_product_flash_attention_backward",
                                      "_scaled_dot_product_flash_attention_for_cpu_backward",
                                      "_scaled_dot_product_cudnn_attention_backward",
                                      "_scaled_dot_product_fused_attention_overrideable_backward",
                                      "_flash_attention_backward"],
    flops="attention", tensor_core=True, fp32_inputs=(5,),
    note="attention gradients: tensor-core GEMMs accumulating in FP32; logsumexp (input 5) stays FP32")
_op("efficient_attention_backward", ALLOW, [], ["_scaled_dot_product_efficient_attention_backward"],
    flops="attention", tensor_core=True, fp32_inputs=(6,),
    note="attention gradients: tensor-core GEMMs accumulating in FP32; logsumexp (input 6) stays FP32")
_op("gemm_fast_gelu", ALLOW, [MS + "GemmFastGelu"], flops="matmul", tensor_core=True)
# transformers' MoE experts under torch.compile/export with FP32 weights (integrations/moe.py): a custom op
# running one torch.mm per expert group, so any dtype works; the (S, K) x (E, K, N) matmul formula counts its
# FLOPs. aten._grouped_mm is not listed: its kernels need 16-byte-aligned strides, which FP16 halves.
_op("grouped_matmul", ALLOW, [], ["grouped_mm_fallback", "grouped_mm_fallback_backward"], flops="matmul",
    tensor_core=True, note="a GEMM per expert group (transformers' MoE grouped_mm_fallback)")
_op("rnn", ALLOW, ["LSTM", "GRU", "RNN"], ["lstm", "gru", "rnn_tanh", "rnn_relu"], flops="rnn", tensor_core=True,
    note="cuDNN RNN cells run their GEMMs on tensor cores")

# -- infer: safe in FP16 given FP16 inputs ---------------------------------------------------------
_many(INFER, "Add/add Sub/sub,rsub Mul/mul Div/div Neg/neg Abs/abs Relu/relu LeakyRelu/leaky_relu PRelu/prelu "
             "Elu/elu Selu Celu Sigmoid/sigmoid Tanh/tanh HardSigmoid/hardsigmoid HardSwish/hardswish "
             "Mish/mish Swish/silu Softsign ThresholdedRelu Clip/clamp,clamp_min,clamp_max,hardtanh "
             "Erf/erf Sqrt/sqrt Min/minimum Max/maximum Mean Sum "
             "Sin/sin Cos/cos Ceil/ceil Floor/floor Round/round Sign/sign Shrink Mod/fmod,remainder "
             "Where/where Equal/eq Greater/gt GreaterOrEqual/ge Less/lt LessOrEqual/le Not/logical_not "
             "IsNaN/isnan IsInf/isinf ArgMax/argmax ArgMin/argmin Dropout/dropout,native_dropout "
             "GridSample/grid_sampler_2d RotaryEmbedding SwiGLU Trilu/tril,triu CausalConvWithState")
_op("gelu", INFER, ["Gelu", MS + "Gelu", MS + "FastGelu", MS + "BiasGelu", MS + "QuickGelu"], ["gelu"],
    flops_per_element=8)
_op("softplus", INFER, ["Softplus"], ["softplus"], flops_per_element=4,
    note="computed as max(x,0)+log1p(exp(-|x|)), bounded")
_op("bias_add", INFER, [MS + "BiasAdd", MS + "BiasSplitGelu", MS + "BiasDropout"])
_op("softmax", INFER, ["Softmax", MS + "BiasSoftmax"], ["_softmax", "softmax", "_safe_softmax"], flops="softmax", accumulates_fp32=True,
    note="kernel computes max, exp and sum in FP32")
_op("log_softmax", INFER, ["LogSoftmax"], ["_log_softmax", "log_softmax"], flops="softmax", accumulates_fp32=True,
    note="kernel computes max, exp and sum in FP32")
_op("layer_norm", INFER, ["LayerNormalization", MS + "LayerNormalization", MS + "SkipLayerNormalization",
                          "SimplifiedLayerNormalization", MS + "SkipSimplifiedLayerNormalization",
                          MS + "SimplifiedLayerNormalization"],
    ["native_layer_norm", "layer_norm"], flops="norm", accumulates_fp32=True, fp32_outputs=(1, 2),
    deny_attrs=(("stash_type", (0,), "stash_type=0 computes the statistics in the input dtype"),),
    note="statistics computed in FP32 (stash_type=1)")
_op("embed_layer_norm", INFER, [MS + "EmbedLayerNormalization"], flops="norm", accumulates_fp32=True,
    note="ONNX Runtime's fused embeddings + LayerNorm (its BERT optimizer's): statistics in FP32")
_op("rms_norm", INFER, ["RMSNormalization"], ["rms_norm", "_fused_rms_norm"], flops="norm", accumulates_fp32=True,
    fp32_outputs=(1,), deny_attrs=(("stash_type", (0,), "stash_type=0 computes the statistics in the input dtype"),),
    unit_inputs=(0,), note="statistics computed in FP32 (stash_type=1)")
_op("group_norm", INFER, ["GroupNormalization", MS + "GroupNorm", MS + "SkipGroupNorm"], ["native_group_norm"],
    flops="norm", accumulates_fp32=True, fp32_inputs=(), note="statistics computed in FP32")
_op("instance_norm", INFER, ["InstanceNormalization"], ["instance_norm"], flops="norm", accumulates_fp32=True,
    note="cuDNN computes the statistics in FP32")
_op("batch_norm", INFER, ["BatchNormalization"],
    ["_native_batch_norm_legit_no_training", "_native_batch_norm_legit", "native_batch_norm", "batch_norm",
     "_native_batch_norm_legit_functional"],
    flops="norm", accumulates_fp32=True, note="cuDNN computes the statistics in FP32")
_op("average_pool", INFER, ["AveragePool", "GlobalAveragePool"], ["avg_pool2d", "adaptive_avg_pool2d", "_adaptive_avg_pool2d"],
    flops="pool", accumulates_fp32=True, note="cuDNN pooling accumulates in FP32")

# -- clear: data movement --------------------------------------------------------------------------
_many(CLEAR, "Reshape/view,_unsafe_view,reshape Squeeze/squeeze Unsqueeze/unsqueeze Flatten/flatten "
             "Identity/clone,alias,detach,lift_fresh_copy", traffic="alias")
_many(CLEAR, "Slice/slice,narrow Gather/index_select,select GatherElements/gather GatherND/index",
      traffic="gather")
_many(CLEAR, "Transpose/permute,transpose,t Concat/cat Split/split,split_with_sizes "
             "Expand/expand Tile/repeat DepthToSpace "
             "SpaceToDepth Compress ReverseSequence Scatter MaxPool/max_pool2d_with_indices,max_pool2d "
             "GlobalMaxPool MaxRoiPool MaxUnpool ReduceMax/amax,max ReduceMin/amin,min "
             "Pad/constant_pad_nd,pad CenterCropPad Col2Im TopK/topk Hardmax Shape Size NonZero/nonzero "
             "OneHot Upsample TensorScatter Optional "
             "OptionalGetElement OptionalHasElement")
_op("resize", CLEAR, ["Resize"], ["upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d",
                                   "upsample_linear1d", "upsample_bilinear2d", "upsample_trilinear3d",
                                   "upsample_bicubic2d", "_upsample_bilinear2d_aa", "_upsample_bicubic2d_aa"],
    infer_attrs=(("mode", ("linear", "cubic"), "linear/cubic interpolation computes weighted sums of at most 64 "
                  "neighbours with weights summing to one, in the op's dtype: bounded as average pooling is "
                  "(nearest only copies); torch autocast runs upsampling in its input dtype"),))
_SCATTER_REDUCE = (("reduction", ("add", "mul", "max", "min"),
                    "scatter with a reduction combines updates in the op's dtype (add/mul accumulate; "
                    "ONNX Runtime's CPU kernels refuse FP16 with a reduction)"),)
# the FX importer gives the aten forms the ONNX attribute: scatter_add, scatter(reduce=...), scatter_reduce and
# index_put(accumulate=True) carry ``reduction``
_op("scatter_nd", CLEAR, ["ScatterND"], ["index_put", "_unsafe_index_put"], deny_attrs=_SCATTER_REDUCE)
_op("scatter_elements", CLEAR, ["ScatterElements"], ["scatter", "scatter_add", "scatter_reduce"],
    deny_attrs=_SCATTER_REDUCE)
_op("sort", CLEAR, [], ["sort", "argsort"], note="reorders values (as TopK)")
_op("cast", CLEAR, ["Cast", "CastLike"], ["_to_copy", "to", "convert_element_type"], dtype_attrs=("to",),
    note="existing casts are retargeted or removed by the casts pass")
_op("constant", CLEAR, ["Constant"], ["scalar_tensor", "full", "zeros", "ones"], dtype_attrs=("value",))
_op("constant_of_shape", CLEAR, ["ConstantOfShape"], ["new_zeros", "new_ones", "zeros_like", "ones_like", "full_like"],
    dtype_attrs=("value",))
_op("eye_like", CLEAR, ["EyeLike"], dtype_attrs=("dtype",),
    fp32_only="ONNX Runtime has no FP16 EyeLike kernel (it writes float, double and integer types only)")

# -- deny: numerically unsafe in FP16 --------------------------------------------------------------
_RANGE = "overflows or loses precision in FP16"
_op("exp", DENY, ["Exp"], ["exp", "expm1"], flops_per_element=4, note="exp overflows FP16 above 11.1")
_op("log", DENY, ["Log"], ["log", "log1p", "log2", "log10"], flops_per_element=4,
    note="log of small FP16 values loses precision")
# torch autocast (CUDA) and Apex O1 run these in FP32; ONNX and aten forms share the row
_op("rsqrt", DENY, ["Rsqrt"], ["rsqrt"], note="1/sqrt(x) overflows FP16 for x below 6e-5 (autocast keeps it FP32)")
_op("reciprocal", DENY, ["Reciprocal"], ["reciprocal"],
    note="1/x overflows FP16 for |x| below 6e-5 (autocast keeps it FP32)")
_op("erfinv", DENY, [], ["erfinv"], note="erfinv " + "overflows or loses precision in FP16")
_op("pow", DENY, ["Pow"], ["pow"], flops_per_element=4, note="pow " + _RANGE)
for _name, _aten in (("ReduceSum", "sum"), ("ReduceProd", "prod"), ("ReduceL1", ""),
                     ("ReduceL2", "norm,linalg_vector_norm"), ("ReduceLogSum", ""), ("ReduceLogSumExp", "logsumexp"),
                     ("ReduceSumSquare", "")):
    _op(_snake(_name), DENY, [_name], [a for a in _aten.split(",") if a], flops="reduction",
        note="reduction accumulates in the op's dtype")
# A mean lies within its inputs' range, so unlike a sum it cannot overflow; the kernels accumulate FP16 in
# FP32 (ONNX Runtime CUDA: reduction_ops.cc sets the cuDNN reduce descriptor to float for MLFloat16 and its
# own kernels use AccumulationType<half> = float; torch's CUDA reductions use acc_type float), and torch
# autocast's CUDA FP32 lists hold sum, prod, cumsum but not mean (aten/src/ATen/autocast_mode.cpp).
# Numerics rule 8 still keeps a mean -> add eps -> root chain FP32 (docs/architecture.md, "Numerics").
_op("reduce_mean", INFER, ["ReduceMean"], ["mean"], flops="reduction", accumulates_fp32=True,
    note="a mean stays within its inputs' range; kernels accumulate FP16 in FP32 (autocast runs it in FP16)")
_op("histc", DENY, [], ["histc"], flops="reduction",
    note="bin counts are written in the input's dtype: FP16 counts are exact only up to 2048")
_op("var_mean", DENY, [], ["var_mean", "var", "std"], flops="reduction", note="reduction accumulates in the op's dtype")
_many(DENY, "CumSum/cumsum CumProd/cumprod", flops="reduction", note="scan accumulates in the op's dtype")
_many(DENY, "SoftmaxCrossEntropyLoss NegativeLogLikelihoodLoss/nll_loss_forward,nll_loss", flops="reduction",
      note="losses are reductions over log-probabilities")
_many(DENY, "LpNormalization LpPool GlobalLpPool MeanVarianceNormalization LRN", flops="reduction",
      note="normalisation accumulates in the op's dtype")
_many(DENY, "Tan/tan Sinh/sinh Cosh/cosh Asin/asin Acos/acos Atan Asinh Acosh Atanh Det DFT STFT AffineGrid",
      note=_RANGE)
_many(DENY, "Range/arange BlackmanWindow HammingWindow HannWindow MelWeightMatrix",
      note="generated values lose precision in FP16")
_many(DENY, "RandomNormal/randn RandomUniform/rand RandomNormalLike/randn_like RandomUniformLike/rand_like "
            "Bernoulli/bernoulli Multinomial/multinomial",
      dtype_attrs=("dtype",), note="random generators stay FP32")
_many(DENY, "QuantizeLinear DynamicQuantizeLinear QLinearConv QLinearMatMul BitCast",
      note="quantisation boundary: scales stay FP32")
_many(DENY, "MatMulInteger ConvInteger",
      note="integer GEMM (dynamic quantization): int8 work, its accumulator's rescale kept FP32 (numerics rule 4)")
_op("dequantize_linear", DENY, ["DequantizeLinear"], dtype_attrs=("output_dtype",), unit_inputs=(1,),
    note="quantisation boundary: scales stay FP32")  # y's dtype follows x_scale (or output_dtype)
_many(DENY, "NonMaxSuppression RoiAlign Unique TfIdfVectorizer LinearAttention", note="no reliable FP16 kernel")
_many(DENY, "SequenceAt SequenceConstruct SequenceInsert SequenceMap SplitToSequence ConcatFromSequence "
            "SequenceEmpty SequenceErase SequenceLength", note="sequence values are not converted")
_op("control_flow", CLEAR, ["If", "Loop", "Scan"], ["cond", "while_loop"], flops="none",
    note="subgraph boundaries keep their dtypes; the ops inside are planned on their own")

# aten-only rows that the FX path needs (no ONNX op of that name).
_op("embedding", CLEAR, [], ["embedding"], traffic="gather")
_op("native_layer_norm_backward", INFER, [], ["native_layer_norm_backward"], flops="norm", accumulates_fp32=True)
# backward ops of a captured training step (the forward ops' rows cover mm/addmm/bmm and the
# elementwise backward math); bias gradients are sum reductions and stay deny.
_op("activation_backward", INFER, [], ["threshold_backward", "gelu_backward", "tanh_backward", "sigmoid_backward",
                                       "silu_backward", "hardtanh_backward", "leaky_relu_backward",
                                       "native_dropout_backward"], flops_per_element=2)
_op("softmax_backward", INFER, [], ["_softmax_backward_data", "_log_softmax_backward_data"], flops="softmax",
    accumulates_fp32=True, dtype_attrs=("input_dtype",), note="kernel reduces in FP32")
_op("loss_backward", DENY, [], ["nll_loss_backward", "mse_loss_backward", "binary_cross_entropy_backward"],
    flops="reduction", note="loss gradients stay FP32 (the backward seed carries the loss scale)")
_op("conv_backward", ALLOW, [], ["convolution_backward"], flops="conv", tensor_core=True,
    note="input and weight gradients are tensor-core convolutions")
_op("norm_backward", INFER, [], ["native_batch_norm_backward", "native_group_norm_backward"], flops="norm",
    accumulates_fp32=True, note="statistics gradients reduce in FP32")
_op("pool_backward", INFER, [], ["avg_pool2d_backward", "_adaptive_avg_pool2d_backward",
                                 "max_pool2d_with_indices_backward"], flops="pool", accumulates_fp32=True)
_op("embedding_backward", DENY, [], ["embedding_dense_backward"], flops="reduction",
    note="scatter-adds rows of the gradient: accumulates in the op's dtype")
_op("stack", CLEAR, [], ["stack"])
_op("view_backward", CLEAR, [], ["slice_backward", "select_backward"],
    note="writes the gradient of a slice into zeros: data movement")
_op("logical", CLEAR, ["And", "Or", "Xor", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot", "BitShift"],
    ["any", "all", "logical_and", "logical_or", "logical_xor", "bitwise_and", "bitwise_or", "bitwise_xor",
     "bitwise_not"], flops="none", note="boolean and integer logic: no float data")
_op("unscale_marker", CLEAR, [], ["unscale_marker"], flops="none",
    note="gradient divided by the loss scale: FP16 propagation stops here")
_op("not_equal", INFER, [], ["ne"])
_op("copy", CLEAR, [], ["copy_", "copy"], note="writes a buffer in place (BatchNorm running statistics)")
_op("empty", CLEAR, [], ["empty", "empty_like", "new_empty", "empty_strided", "empty_permuted"], flops="none",
    note="uninitialised storage (dropout masks, BatchNorm outputs in decompositions)")
_op("runtime_check", CLEAR, [], ["_assert_tensor_metadata", "_assert_scalar", "_assert_async",
                                 "sym_constrain_range_for_size"], flops="none",
    note="a run-time check; reads whatever dtype arrives")


@dataclass
class Registry:
    """Lookup from source op names to ``OpDef`` rows, plus user overrides of the class."""

    by_canonical: dict[str, OpDef] = field(default_factory=dict)
    by_onnx: dict[tuple[str, str], OpDef] = field(default_factory=dict)
    by_aten: dict[str, OpDef] = field(default_factory=dict)

    @classmethod
    def default(cls) -> "Registry":
        reg = cls()
        for row in _ROWS:
            if row.canonical in reg.by_canonical:
                raise ValueError(f"canonical op {row.canonical!r} appears twice in the registry")
            reg.by_canonical[row.canonical] = row
            for name in row.onnx:
                domain, _, op = name.rpartition("::")
                key = (domain, op)
                if key in reg.by_onnx:
                    raise ValueError(f"ONNX op {name!r} maps to two canonical ops")
                reg.by_onnx[key] = row
            for name in row.aten:
                reg.by_aten[name] = row
        return reg

    def lookup_onnx(self, domain: str, op_type: str) -> OpDef | None:
        domain = "" if domain in ("", "ai.onnx") else domain
        return self.by_onnx.get((domain, op_type))

    def lookup_aten(self, packet_name: str) -> OpDef | None:
        """``packet_name`` is the overload packet without namespace, e.g. ``"addmm"``."""
        return self.by_aten.get(packet_name)


DEFAULT_REGISTRY = Registry.default()
