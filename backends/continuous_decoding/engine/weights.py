"""A GPT-2 checkpoint directory (Hugging Face config.json + model.safetensors) as float32 numpy
arrays, the form the runners consume. Reads local files only."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"

# Both spell GPT-2's tanh approximation of GELU; the runner implements only that one.
_TANH_GELU = ("gelu_new", "gelu_pytorch_tanh")


class WeightsError(ValueError):
    """The directory is not a GPT-2 checkpoint this engine can run; the message names the field."""


@dataclass(frozen=True)
class ModelConfig:
    """The GPT-2 config values the engine depends on."""

    n_layer: int
    n_head: int
    n_embd: int
    n_inner: int  # MLP width
    n_positions: int  # longest sequence (prompt + output) the position table covers
    vocab_size: int
    layer_norm_epsilon: float
    bos_token_id: int | None
    eos_token_id: int | None

    def __post_init__(self):
        for name in ("n_layer", "n_head", "n_embd", "n_inner", "n_positions", "vocab_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise WeightsError(f"{name}: must be a positive integer, got {value!r}")
        if self.n_embd % self.n_head:
            raise WeightsError(f"n_embd: {self.n_embd} is not divisible by n_head={self.n_head}")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @classmethod
    def from_hf_config(cls, config: dict) -> ModelConfig:
        """Refuses variants the runner would compute wrongly rather than serving wrong logits."""
        if config.get("model_type") != "gpt2":
            raise WeightsError(f"model_type: expected 'gpt2', got {config.get('model_type')!r}")
        if config.get("activation_function", "gelu_new") not in _TANH_GELU:
            raise WeightsError(f"activation_function: only {_TANH_GELU} are supported, "
                               f"got {config['activation_function']!r}")
        unsupported = {"scale_attn_weights": False, "scale_attn_by_inverse_layer_idx": True,
                       "add_cross_attention": True}
        for key, bad in unsupported.items():
            if config.get(key, not bad) == bad:
                raise WeightsError(f"{key}: {bad} is not supported")
        missing = [k for k in ("n_layer", "n_head", "n_embd", "n_positions", "vocab_size") if k not in config]
        if missing:
            raise WeightsError(f"{', '.join(missing)}: missing from config.json")
        return cls(
            n_layer=config["n_layer"], n_head=config["n_head"], n_embd=config["n_embd"],
            n_inner=config.get("n_inner") or 4 * config["n_embd"], n_positions=config["n_positions"],
            vocab_size=config["vocab_size"], layer_norm_epsilon=float(config.get("layer_norm_epsilon", 1e-5)),
            bos_token_id=config.get("bos_token_id"), eos_token_id=config.get("eos_token_id"),
        )


@dataclass(frozen=True, eq=False)
class LayerWeights:
    """One transformer block. Dense weights are [in, out] as GPT-2's Conv1D stores them: y = x @ w + b."""

    ln_1_weight: np.ndarray  # [n_embd]
    ln_1_bias: np.ndarray
    qkv_weight: np.ndarray  # [n_embd, 3 * n_embd]: q, k, v side by side, heads contiguous in each
    qkv_bias: np.ndarray  # [3 * n_embd]
    attn_out_weight: np.ndarray  # [n_embd, n_embd]
    attn_out_bias: np.ndarray
    ln_2_weight: np.ndarray
    ln_2_bias: np.ndarray
    fc_weight: np.ndarray  # [n_embd, n_inner]
    fc_bias: np.ndarray
    mlp_out_weight: np.ndarray  # [n_inner, n_embd]
    mlp_out_bias: np.ndarray


_LAYER_KEYS = {  # LayerWeights field -> checkpoint name under h.<i>.
    "ln_1_weight": "ln_1.weight", "ln_1_bias": "ln_1.bias",
    "qkv_weight": "attn.c_attn.weight", "qkv_bias": "attn.c_attn.bias",
    "attn_out_weight": "attn.c_proj.weight", "attn_out_bias": "attn.c_proj.bias",
    "ln_2_weight": "ln_2.weight", "ln_2_bias": "ln_2.bias",
    "fc_weight": "mlp.c_fc.weight", "fc_bias": "mlp.c_fc.bias",
    "mlp_out_weight": "mlp.c_proj.weight", "mlp_out_bias": "mlp.c_proj.bias",
}


@dataclass(frozen=True, eq=False)
class ModelWeights:
    """Read-only after loading, so runners on any thread may share one instance."""

    config: ModelConfig
    wte: np.ndarray  # [vocab_size, n_embd] token embeddings
    wpe: np.ndarray  # [n_positions, n_embd] position embeddings
    layers: tuple[LayerWeights, ...]
    ln_f_weight: np.ndarray  # [n_embd]
    ln_f_bias: np.ndarray
    lm_head: np.ndarray  # [vocab_size, n_embd] the output projection: wte itself when the embeddings are tied


def load_weights(model_dir: Path | str) -> ModelWeights:
    from safetensors.numpy import load_file  # imported here so that importing the engine stays cheap

    model_dir = Path(model_dir)
    config_path, weights_path = model_dir / CONFIG_FILE, model_dir / WEIGHTS_FILE
    for path in (config_path, weights_path):
        if not path.is_file():
            raise WeightsError(f"{path}: missing (make it with scripts/make_decoder_weights.py)")
    hf_config = json.loads(config_path.read_text())
    config = ModelConfig.from_hf_config(hf_config)
    tensors = load_file(str(weights_path))
    # save_pretrained of GPT2LMHeadModel writes transformer.h.0...; of GPT2Model, h.0...
    prefix = "transformer." if any(k.startswith("transformer.") for k in tensors) else ""

    def take(name: str, shape: tuple[int, ...], prefix: str = prefix) -> np.ndarray:
        key = prefix + name
        if key not in tensors:
            raise WeightsError(f"{weights_path}: tensor {key!r} is missing")
        array = np.ascontiguousarray(tensors[key], dtype=np.float32)
        if array.shape != shape:
            raise WeightsError(f"{weights_path}: tensor {key!r} has shape {array.shape}; "
                               f"config.json implies {shape}")
        array.setflags(write=False)
        return array

    e, inner = config.n_embd, config.n_inner
    shapes = {
        "ln_1_weight": (e,), "ln_1_bias": (e,), "qkv_weight": (e, 3 * e), "qkv_bias": (3 * e,),
        "attn_out_weight": (e, e), "attn_out_bias": (e,), "ln_2_weight": (e,), "ln_2_bias": (e,),
        "fc_weight": (e, inner), "fc_bias": (inner,), "mlp_out_weight": (inner, e), "mlp_out_bias": (e,),
    }
    layers = tuple(
        LayerWeights(**{field: take(f"h.{i}.{key}", shapes[field]) for field, key in _LAYER_KEYS.items()})
        for i in range(config.n_layer)
    )
    wte = take("wte.weight", (config.vocab_size, e))
    lm_head = wte
    if not hf_config.get("tie_word_embeddings", True):
        lm_head = take("lm_head.weight", (config.vocab_size, e), prefix="")
    return ModelWeights(
        config=config, wte=wte, wpe=take("wpe.weight", (config.n_positions, e)), layers=layers,
        ln_f_weight=take("ln_f.weight", (e,)), ln_f_bias=take("ln_f.bias", (e,)), lm_head=lm_head,
    )
