"""Per-request sampling settings, validated on construction with errors that name the field."""
from __future__ import annotations

from dataclasses import dataclass, field


class InvalidRequest(ValueError):
    """A request the engine refuses; `field` names the input at fault."""

    def __init__(self, field_name: str, message: str):
        super().__init__(f"{field_name}: {message}")
        self.field = field_name


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 0.0  # 0: greedy
    top_k: int = 0  # 0: off
    top_p: float = 1.0
    seed: int | None = None  # per-request RNG seed, for reproducible sampling
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    ignore_eos: bool = False

    def __post_init__(self):
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise InvalidRequest("max_tokens", f"must be a positive integer, got {self.max_tokens!r}")
        if not self.temperature >= 0.0:
            raise InvalidRequest("temperature", f"must be >= 0, got {self.temperature!r}")
        if self.top_k < 0:
            raise InvalidRequest("top_k", f"must be >= 0 (0 turns it off), got {self.top_k!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidRequest("top_p", f"must be in (0, 1], got {self.top_p!r}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0
