"""One request's tokens and bookkeeping as it moves through the engine. Knows nobody."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

from .sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class FinishReason(str, enum.Enum):
    LENGTH = "length"
    STOP = "stop"
    CANCELLED = "cancelled"
    ERROR = "error"


@dataclass(eq=False)
class Sequence:
    """Owned by the engine thread."""

    seq_id: int
    prompt_token_ids: list[int]
    sampling: SamplingParams
    arrival_s: float = 0.0
    priority: int = 0  # lower runs first, as Triton's priority levels
    output_token_ids: list[int] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0  # tokens whose keys and values are in the cache
    block_table: list[int] = field(default_factory=list)  # cache blocks, in token order
    finish_reason: FinishReason | None = None
    num_preemptions: int = 0

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    @property
    def is_prefill(self) -> bool:
        """Still computing tokens it already has (the prompt, or all of them after a preemption)."""
        return self.num_uncomputed_tokens > 1

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED
