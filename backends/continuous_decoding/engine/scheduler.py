"""Iteration-level scheduling (Orca/vLLM): each step, decode tokens for the running sequences first,
then prefill chunks, under a token budget and a sequence cap; when KV blocks run out, the newest
running sequence is preempted and recomputed later. `static` admits a new batch only when the
previous one has finished, the request-level baseline."""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from .block_manager import BlockManager
from .config import EngineConfig
from .sampling_params import InvalidRequest
from .sequence import FinishReason, Sequence, SequenceStatus


@dataclass(frozen=True)
class ScheduledSeq:
    seq: Sequence
    num_new_tokens: int  # this step computes seq.token_ids[num_computed : num_computed + num_new_tokens]


@dataclass(frozen=True)
class SchedulerOutput:
    scheduled: tuple[ScheduledSeq, ...]  # in batch order: decodes first, then prefill chunks
    preempted: tuple[Sequence, ...]  # moved back to waiting this step, their blocks freed
    num_batched_tokens: int

    @property
    def is_empty(self) -> bool:
        return not self.scheduled

    def batch_rows(self) -> list[tuple[list[int], int, int, list[int]]]:
        """The argument of batch.build_batch; call it before on_step_done advances the sequences."""
        return [(s.seq.token_ids, s.seq.num_computed_tokens, s.num_new_tokens, list(s.seq.block_table))
                for s in self.scheduled]


class Scheduler:
    def __init__(self, config: EngineConfig, block_manager: BlockManager):
        if config.block_size != block_manager.block_size:
            raise ValueError(f"block_size differs: config {config.block_size}, "
                             f"block manager {block_manager.block_size}")
        self.config = config
        self.block_manager = block_manager
        # Owned by the engine thread, as are the sequences in them: only it calls the methods below.
        # Both stay sorted by _order_key, so the front of waiting is the next to join and the back of
        # running is the newest, the first to be preempted.
        self.waiting: deque[Sequence] = deque()
        self.running: deque[Sequence] = deque()

    def add(self, seq: Sequence) -> None:
        """Queues a new sequence, or raises InvalidRequest if it could never be served."""
        self._check_fits(seq)
        seq.status = SequenceStatus.WAITING
        self._insert(self.waiting, seq)

    def abort(self, seq_id: int) -> Sequence | None:
        """Cancels a waiting or running sequence; None if no unfinished sequence has this id."""
        for queue in (self.waiting, self.running):
            for seq in queue:
                if seq.seq_id == seq_id:
                    self.finish(seq, FinishReason.CANCELLED)
                    return seq
        return None

    def finish(self, seq: Sequence, reason: FinishReason) -> None:
        """Removes seq from its queue at once and frees its blocks."""
        if seq.is_finished:
            raise RuntimeError(f"sequence {seq.seq_id} is already finished ({seq.finish_reason})")
        queue = self.running if seq.status is SequenceStatus.RUNNING else self.waiting
        queue.remove(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        plan = _StepPlan(self.config.max_num_batched_tokens)
        if self.config.scheduling == "static" and not self.running:
            self._admit_static_batch()
        decoding = [s for s in self.running if not s.is_prefill]
        prefilling = [s for s in self.running if s.is_prefill]
        for seq in decoding + prefilling:
            if seq.status is not SequenceStatus.RUNNING:
                continue  # preempted earlier in this loop to make room for an older sequence
            assert seq.num_uncomputed_tokens >= 1, f"sequence {seq.seq_id} got no sampled token"
            num_new = self._chunk_len(seq, plan.budget)
            if num_new and self._make_room(seq, num_new, plan):
                self.block_manager.allocate(seq, num_new)
                plan.add(seq, num_new)
        # After a preemption the cache is full; admitting more would only preempt again next step.
        if self.config.scheduling == "continuous" and not plan.preempted:
            while self.waiting and len(self.running) < self.config.max_num_seqs and plan.budget > 0:
                seq = self.waiting[0]
                num_new = self._chunk_len(seq, plan.budget)
                if num_new == 0 or not self.block_manager.can_allocate(seq, num_new):
                    break  # strict order: a later, smaller request does not overtake the head
                self.waiting.popleft()
                seq.status = SequenceStatus.RUNNING
                self._insert(self.running, seq)
                self.block_manager.allocate(seq, num_new)
                plan.add(seq, num_new)
        return SchedulerOutput(tuple(ScheduledSeq(seq, n) for seq, n in plan.num_new.items()),
                               tuple(plan.preempted), self.config.max_num_batched_tokens - plan.budget)

    def on_step_done(self, output: SchedulerOutput) -> list[int]:
        """Marks the step's tokens as computed. Returns the rows of output.scheduled (= rows of the
        batch) whose sequences computed their last token and now need a sampled one: the engine must
        append it to seq.output_token_ids, or finish the sequence, before the next schedule()."""
        rows = []
        for row, item in enumerate(output.scheduled):
            if item.seq.is_finished:
                continue  # aborted while the step ran; its blocks are already free
            item.seq.num_computed_tokens += item.num_new_tokens
            if item.seq.num_computed_tokens == item.seq.num_tokens:
                rows.append(row)
        return rows

    def _order_key(self, seq: Sequence) -> tuple:
        # seq_id breaks ties between equal arrival times: the engine hands ids out in arrival order.
        priority = seq.priority if self.config.enable_priority else 0
        return (priority, seq.arrival_s, seq.seq_id)

    def _insert(self, queue: deque[Sequence], seq: Sequence) -> None:
        key = self._order_key(seq)
        index = len(queue)
        while index > 0 and self._order_key(queue[index - 1]) > key:
            index -= 1
        queue.insert(index, seq)

    def _chunk_len(self, seq: Sequence, budget: int) -> int:
        """Tokens of seq to compute this step with `budget` tokens left; 0 if it must wait."""
        if self.config.enable_chunked_prefill:
            return min(seq.num_uncomputed_tokens, budget)
        return seq.num_uncomputed_tokens if seq.num_uncomputed_tokens <= budget else 0

    def _make_room(self, seq: Sequence, num_new: int, plan: _StepPlan) -> bool:
        """Preempts the newest running sequences, unscheduling them if this step already took them,
        until seq's tokens fit. False if seq was itself the newest left, and so was preempted."""
        while not self.block_manager.can_allocate(seq, num_new):
            victim = self.running[-1]
            plan.drop(victim)
            self._preempt(victim)
            if victim is seq:
                return False
        return True

    def _preempt(self, seq: Sequence) -> None:
        # Recompute mode: the outputs stay, so on resume prompt + outputs run again as one prefill.
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        # Without priorities it is older than every waiting sequence, so it lands at the front.
        self._insert(self.waiting, seq)

    def _admit_static_batch(self) -> None:
        """Moves waiting sequences into running while their whole lengths fit the cache together, so
        the batch runs to its end without a preemption."""
        num_reserved = 0
        while self.waiting and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            need = self.block_manager.blocks_for(_max_kv_tokens(seq))
            if num_reserved + need > self.block_manager.num_free_blocks:
                break
            num_reserved += need
            self.waiting.popleft()
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)

    def _check_fits(self, seq: Sequence) -> None:
        num_prompt, max_tokens = seq.num_prompt_tokens, seq.sampling.max_tokens
        max_len, num_blocks = self.config.max_model_len, self.block_manager.num_blocks
        if num_prompt < 1:
            raise InvalidRequest("prompt", "must hold at least one token")
        if num_prompt >= max_len:
            raise InvalidRequest("prompt", f"{num_prompt} tokens leave no room to generate within "
                                           f"max_model_len={max_len}; at most {max_len - 1}")
        if num_prompt + max_tokens > max_len:
            raise InvalidRequest("max_tokens", f"prompt ({num_prompt} tokens) + max_tokens ({max_tokens}) "
                                               f"exceeds max_model_len={max_len}; at most {max_len - num_prompt}")
        if self.block_manager.blocks_for(num_prompt) > num_blocks:
            raise InvalidRequest("prompt", f"{num_prompt} tokens need more KV blocks than the whole cache "
                                           f"holds ({num_blocks} blocks of {self.config.block_size} tokens)")
        if self.block_manager.blocks_for(_max_kv_tokens(seq)) > num_blocks:
            room = num_blocks * self.config.block_size - num_prompt + 1
            raise InvalidRequest("max_tokens", f"prompt ({num_prompt} tokens) + max_tokens ({max_tokens}) need "
                                               f"more KV blocks than the whole cache holds ({num_blocks} blocks "
                                               f"of {self.config.block_size} tokens); at most {room}")


class _StepPlan:
    """What one schedule() call has decided so far; lives only inside that call."""

    def __init__(self, budget: int):
        self.budget = budget  # tokens still free in this step's batch
        self.num_new: dict[Sequence, int] = {}  # in batch order
        self.preempted: list[Sequence] = []

    def add(self, seq: Sequence, num_new: int) -> None:
        self.num_new[seq] = num_new
        self.budget -= num_new

    def drop(self, seq: Sequence) -> None:
        """Records seq as preempted, giving back its tokens if it was scheduled earlier this step."""
        self.budget += self.num_new.pop(seq, 0)
        self.preempted.append(seq)


def _max_kv_tokens(seq: Sequence) -> int:
    # The last sampled token ends the sequence and is never run through the model, so it needs no slot.
    return seq.num_prompt_tokens + seq.sampling.max_tokens - 1
