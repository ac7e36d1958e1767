"""Every GPT-2 layer except attention, as ONNX Runtime sessions built in memory from the loaded
weights: layer norms, the QKV, output and MLP projections, GELU, residual adds, and the LM head, over
the packed [num_tokens, n_embd] rows of a step.

Why ONNX Runtime: its CPU matmul (MLAS) packs each weight matrix once, when the session is made,
where numpy's BLAS packs it again on every call. Measured on the distilgpt2 shape, the matmuls of a
layer plus the LM head, 2 cores (scripts/bench_dense_layers.py): 1.2-1.7x numpy's speed at 8 to 512
rows; at one row the per-call cost shows (0.6x), yet a one-sequence decode step is still faster than
with numpy (BENCHMARKS.md, decoding).

A step runs n_layer + 1 sessions, split where attention sits:
  first:  x -> LN1 -> QKV of layer 0
  middle: (x, attention of layer i) -> output projection + residual -> LN2 -> MLP + residual = x'
          -> LN1 -> QKV of layer i + 1; returns (x', qkv)
  last:   (x, attention of the last layer) -> ... -> x' -> final LN -> logits
"""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from .cpu import available_cores
from .weights import LayerWeights, ModelWeights

_OPSET = 20  # Gelu with approximate="tanh": GPT-2's "gelu_new", exactly
_IR_VERSION = 10  # what the pinned onnxruntime reads; the onnx package would write its newest


class DenseGraph:
    """Nodes and initializers of one session's graph, named uniquely by a prefix per call."""

    def __init__(self, epsilon: float):
        self.nodes: list = []
        self.initializers: list = []
        self.epsilon = epsilon

    def constant(self, name: str, array: np.ndarray) -> str:
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(array, dtype=np.float32), name))
        return name

    def node(self, op: str, inputs: list[str], output: str, **attributes) -> str:
        self.nodes.append(helper.make_node(op, inputs, [output], **attributes))
        return output

    def layer_norm(self, x: str, weight: np.ndarray, bias: np.ndarray, name: str) -> str:
        return self.node("LayerNormalization", [x, self.constant(f"{name}.weight", weight),
                                                self.constant(f"{name}.bias", bias)], name,
                         axis=-1, epsilon=self.epsilon)

    def linear(self, x: str, weight: np.ndarray, bias: np.ndarray | None, name: str) -> str:
        """x @ weight (+ bias): weight [in, out], as GPT-2's Conv1D stores it."""
        product = self.node("MatMul", [x, self.constant(f"{name}.weight", weight)], f"{name}.matmul")
        if bias is None:
            return product
        return self.node("Add", [product, self.constant(f"{name}.bias", bias)], name)

    def qkv(self, x: str, layer: LayerWeights, i: int) -> str:
        h = self.layer_norm(x, layer.ln_1_weight, layer.ln_1_bias, f"h{i}.ln_1")
        return self.linear(h, layer.qkv_weight, layer.qkv_bias, f"h{i}.qkv")

    def block_rest(self, x: str, attention: str, layer: LayerWeights, i: int) -> str:
        """The residual stream after layer i, from its input x and its attention output."""
        projected = self.linear(attention, layer.attn_out_weight, layer.attn_out_bias, f"h{i}.attn_out")
        x = self.node("Add", [x, projected], f"h{i}.after_attention")
        h = self.layer_norm(x, layer.ln_2_weight, layer.ln_2_bias, f"h{i}.ln_2")
        h = self.node("Gelu", [self.linear(h, layer.fc_weight, layer.fc_bias, f"h{i}.fc")], f"h{i}.gelu",
                      approximate="tanh")
        mlp = self.linear(h, layer.mlp_out_weight, layer.mlp_out_bias, f"h{i}.mlp_out")
        return self.node("Add", [x, mlp], f"h{i}.out")

    def session(self, inputs: dict[str, int], outputs: dict[str, int], threads: int) -> ort.InferenceSession:
        """inputs, outputs: name -> width of a [rows, width] float32 tensor, rows dynamic."""
        def values(widths):
            return [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["rows", w]) for n, w in widths.items()]
        graph = helper.make_graph(self.nodes, "dense", values(inputs), values(outputs), self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", _OPSET)], ir_version=_IR_VERSION)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        # Idle pool threads sleep instead of spinning: n_layer + 1 spinning pools and the attention
        # threads would fight over the cores between runs.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


class DenseLayers:
    """Read-only after construction; run() calls come from the engine thread."""

    def __init__(self, weights: ModelWeights, threads: int | None = None):
        c = weights.config
        threads = threads or available_cores()
        n_embd, width = c.n_embd, 3 * c.n_embd
        layers = weights.layers

        first = DenseGraph(c.layer_norm_epsilon)
        sessions = [first.session({"x": n_embd}, {first.qkv("x", layers[0], 0): width}, threads)]
        self._middle_outputs = []
        for i in range(c.n_layer - 1):
            g = DenseGraph(c.layer_norm_epsilon)
            x = g.block_rest("x", "attention", layers[i], i)
            qkv = g.qkv(x, layers[i + 1], i + 1)
            sessions.append(g.session({"x": n_embd, "attention": n_embd}, {x: n_embd, qkv: width}, threads))
            self._middle_outputs.append([x, qkv])
        last = DenseGraph(c.layer_norm_epsilon)
        x = last.block_rest("x", "attention", layers[-1], c.n_layer - 1)
        h = last.layer_norm(x, weights.ln_f_weight, weights.ln_f_bias, "ln_f")
        logits = last.linear(h, weights.lm_head.T, None, "lm_head")
        sessions.append(last.session({"x": n_embd, "attention": n_embd}, {logits: c.vocab_size}, threads))
        self._sessions = sessions
        self._logits = logits
        self._first_qkv = sessions[0].get_outputs()[0].name

    def first_qkv(self, x: np.ndarray) -> np.ndarray:
        """[rows, n_embd] embeddings -> [rows, 3 * n_embd] queries, keys and values of layer 0."""
        return self._sessions[0].run([self._first_qkv], {"x": x})[0]

    def next_layer(self, i: int, x: np.ndarray, attention: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Finish layer i (i < n_layer - 1) from its input x and attention output, both [rows, n_embd]:
        (the residual stream after layer i, the queries, keys and values of layer i + 1)."""
        x, qkv = self._sessions[i + 1].run(self._middle_outputs[i], {"x": x, "attention": attention})
        return x, qkv

    def logits(self, x: np.ndarray, attention: np.ndarray) -> np.ndarray:
        """Finish the last layer and project: [rows, n_embd] twice -> [rows, vocab_size] logits."""
        return self._sessions[-1].run([self._logits], {"x": x, "attention": attention})[0]
