"""The engine's settings: the one owner of the `parameters` in config.pbtxt, parsed once into a frozen
dataclass that rejects bad values with a message naming the field and the allowed range."""
from __future__ import annotations

from dataclasses import dataclass, fields

MIB = 1 << 20
BYTES_PER_VALUE = 4  # the KV cache holds float32
SCHEDULING_POLICIES = ("continuous", "static")
_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")
# Upper bounds catch typos (an extra zero, bytes given as MiB), not hardware limits.
_INT_RANGES = {
    "block_size": (1, 1024),
    "kv_cache_bytes": (1, 1 << 40),
    "max_num_seqs": (1, 4096),
    "max_num_batched_tokens": (1, 1 << 20),
    "max_model_len": (1, 1 << 20),
}


class ConfigError(ValueError):
    """A bad engine setting; `field` names it."""

    def __init__(self, field_name: str, message: str):
        super().__init__(f"parameter {field_name!r}: {message}")
        self.field = field_name


@dataclass(frozen=True)
class EngineConfig:
    block_size: int = 16  # tokens per KV block
    kv_cache_bytes: int = 256 * MIB  # budget for K and V of every layer; sets the number of blocks
    max_num_seqs: int = 64  # sequences in one step's batch
    max_num_batched_tokens: int = 512  # tokens in one step's batch (decodes + prefill chunks)
    max_model_len: int = 1024  # prompt + generated tokens; the engine checks it against n_positions
    enable_chunked_prefill: bool = True  # a prompt may be split across steps
    scheduling: str = "continuous"  # "continuous" (iteration-level) or "static" (request-level)
    enable_priority: bool = False  # waiting order by (priority, arrival) rather than arrival alone

    def __post_init__(self):
        for name, (low, high) in _INT_RANGES.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ConfigError(name, f"must be an integer in [{low}, {high}], got {value!r}")
        for name in ("enable_chunked_prefill", "enable_priority"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(name, f"must be true or false, got {getattr(self, name)!r}")
        if self.scheduling not in SCHEDULING_POLICIES:
            raise ConfigError("scheduling", f"must be one of {', '.join(SCHEDULING_POLICIES)}, "
                                            f"got {self.scheduling!r}")
        # Every running sequence gets its decode token each step; a smaller budget would starve some.
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ConfigError("max_num_batched_tokens",
                              f"must be >= max_num_seqs ({self.max_num_seqs}), got {self.max_num_batched_tokens}")
        # Without chunking a prompt runs whole in one step, so the longest one must fit the budget.
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ConfigError("max_num_batched_tokens",
                              f"must be >= max_model_len ({self.max_model_len}) when "
                              f"enable_chunked_prefill is false, got {self.max_num_batched_tokens}")

    @classmethod
    def from_parameters(cls, params: dict[str, str]) -> EngineConfig:
        """params: the string values of `parameters` in config.pbtxt; missing keys take the defaults."""
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(params) - set(known))
        if unknown:
            raise ConfigError(unknown[0], f"unknown; the engine takes {', '.join(known)}")
        values = {}
        for name, text in params.items():
            default = known[name].default
            if isinstance(default, bool):
                values[name] = _parse_bool(name, text)
            elif isinstance(default, int):
                values[name] = _parse_int(name, text)
            else:
                values[name] = text.strip()
        return cls(**values)

    def num_kv_blocks(self, num_layers: int, hidden_size: int) -> int:
        """Blocks that fit kv_cache_bytes for a model of this shape (K and V, every layer, float32)."""
        if num_layers < 1 or hidden_size < 1:
            raise ValueError(f"model shape must be positive, got num_layers={num_layers}, hidden_size={hidden_size}")
        bytes_per_block = 2 * num_layers * self.block_size * hidden_size * BYTES_PER_VALUE
        num_blocks = self.kv_cache_bytes // bytes_per_block
        if num_blocks < 1:
            raise ConfigError("kv_cache_bytes",
                              f"{self.kv_cache_bytes} bytes hold no KV block: one block of {self.block_size} "
                              f"tokens needs {bytes_per_block} bytes ({num_layers} layers, hidden size "
                              f"{hidden_size}); raise kv_cache_bytes to at least {bytes_per_block}")
        return num_blocks


def _parse_int(name: str, text: str) -> int:
    low, high = _INT_RANGES[name]
    try:
        return int(text.strip(), 10)
    except ValueError:
        raise ConfigError(name, f"must be an integer in [{low}, {high}], got {text!r}") from None


def _parse_bool(name: str, text: str) -> bool:
    word = text.strip().lower()
    if word in _TRUE or word in _FALSE:
        return word in _TRUE
    raise ConfigError(name, f"must be true or false, got {text!r}")
