"""The engine step, as the algorithm reads: schedule a ragged batch, run it, sample the sequences
that computed their last token, finish those that are done. Wires scheduler, runner and sampler."""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .batch import build_batch
from .block_manager import BlockManager
from .config import ConfigError, EngineConfig
from .runner import CpuRunner, ModelRunner
from .sampler import log_softmax, make_generator, sample
from .sampling_params import InvalidRequest, SamplingParams
from .scheduler import Scheduler
from .sequence import FinishReason, Sequence
from .weights import ModelWeights


@dataclass(frozen=True)
class TokenOutput:
    """One sequence's news from one step: a new token, and whether it ended the sequence."""

    seq_id: int
    token_id: int | None  # None when the sequence ended without a token (cancelled)
    logprob: float | None  # of token_id; with record_logprobs only
    finish_reason: FinishReason | None
    num_prompt_tokens: int
    num_output_tokens: int
    logprobs: np.ndarray | None = None  # [vocab] the row the token was sampled from (record_logprobs)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class EngineStats:
    """Counters since start; owned by the engine thread, read as a snapshot by others."""

    num_steps: int = 0
    num_preemptions: int = 0
    num_generated_tokens: int = 0
    last_step_num_seqs: int = 0
    last_step_num_tokens: int = 0
    peak_kv_blocks_used: int = 0


class LLMEngine:
    """Owned by one thread: every method mutates scheduler, cache and sequences without locks."""

    def __init__(self, config: EngineConfig, weights: ModelWeights, runner: ModelRunner | None = None,
                 record_logprobs: bool = False):
        model = weights.config
        if config.max_model_len > model.n_positions:
            raise ConfigError("max_model_len", f"{config.max_model_len} exceeds the model's "
                                               f"{model.n_positions} positions")
        self.config = config
        self.model_config = model
        num_blocks = config.num_kv_blocks(model.n_layer, model.n_embd)
        self.block_manager = BlockManager(num_blocks, config.block_size)
        self.scheduler = Scheduler(config, self.block_manager)
        self.runner = runner or CpuRunner(weights, num_blocks, config.block_size)
        self.stats = EngineStats()
        self._sequences: dict[int, Sequence] = {}  # unfinished, by id
        self._generators: dict[int, np.random.Generator] = {}
        self._record_logprobs = record_logprobs  # tests compare whole distributions with a reference

    def add_request(self, seq_id: int, prompt_token_ids: list[int], sampling: SamplingParams,
                    priority: int = 0, arrival_s: float | None = None) -> Sequence:
        """Queue a request; raise InvalidRequest naming the field if it can never be served."""
        if seq_id in self._sequences:
            raise InvalidRequest("request_id", f"{seq_id} is already running")
        tokens = [int(t) for t in prompt_token_ids]
        if not tokens:
            raise InvalidRequest("prompt", "is empty")
        vocab = self.model_config.vocab_size
        bad = [t for t in tokens if not 0 <= t < vocab]
        if bad:
            raise InvalidRequest("input_ids", f"token ids {bad[:5]} are outside the vocabulary [0, {vocab})")
        bad_stops = [t for t in sampling.stop_token_ids if not 0 <= t < vocab]
        if bad_stops:
            raise InvalidRequest("stop_token_ids", f"{bad_stops[:5]} are outside the vocabulary [0, {vocab})")
        seq = Sequence(seq_id, tokens, sampling, time.monotonic() if arrival_s is None else arrival_s, priority)
        self.scheduler.add(seq)  # raises InvalidRequest for a prompt that can never fit
        self._sequences[seq_id] = seq
        self._generators[seq_id] = make_generator(sampling)
        return seq

    def abort(self, seq_id: int) -> TokenOutput | None:
        """Cancel a request; its blocks are free when this returns. None if it is not running."""
        seq = self.scheduler.abort(seq_id)
        if seq is None:
            return None
        self._forget(seq)
        return self._output(seq, None, None)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    def step(self) -> list[TokenOutput]:
        output = self.scheduler.schedule()
        self.stats.num_preemptions += len(output.preempted)
        if output.is_empty:
            return []
        batch = build_batch(output.batch_rows(), self.config.block_size)
        logits = self.runner.execute(batch)  # [num_seqs, vocab]
        self._count_step(output, batch.num_tokens)
        rows = self.scheduler.on_step_done(output)
        if not rows:
            return []
        seqs = [output.scheduled[r].seq for r in rows]
        tokens = sample(logits[rows], [s.sampling for s in seqs], [self._generators[s.seq_id] for s in seqs])
        # Nothing served reads log-probabilities, and over the whole vocabulary they cost about 10 ms
        # per decode step at 64 sequences (7 %): only the tests' reference runs ask for them.
        rows_logprobs = log_softmax(logits[rows]) if self._record_logprobs else [None] * len(rows)
        results = []
        for seq, token, row in zip(seqs, tokens.tolist(), rows_logprobs):
            logprob = None if row is None else float(row[token])
            seq.output_token_ids.append(token)
            self.stats.num_generated_tokens += 1
            reason = self._finish_reason(seq, token)
            if reason is not None:
                self.scheduler.finish(seq, reason)
                self._forget(seq)
            results.append(self._output(seq, token, logprob, row))
        return results

    def _count_step(self, output, num_tokens: int) -> None:
        s = self.stats
        s.num_steps += 1
        s.last_step_num_seqs = len(output.scheduled)
        s.last_step_num_tokens = num_tokens
        s.peak_kv_blocks_used = max(s.peak_kv_blocks_used, self.block_manager.num_used_blocks)

    def _finish_reason(self, seq: Sequence, token: int) -> FinishReason | None:
        p = seq.sampling
        if token in p.stop_token_ids:
            return FinishReason.STOP
        if not p.ignore_eos and token == self.model_config.eos_token_id:
            return FinishReason.STOP
        if len(seq.output_token_ids) >= p.max_tokens or seq.num_tokens >= self.config.max_model_len:
            return FinishReason.LENGTH
        return None

    def _forget(self, seq: Sequence) -> None:
        self._sequences.pop(seq.seq_id, None)
        self._generators.pop(seq.seq_id, None)

    @staticmethod
    def _output(seq: Sequence, token: int | None, logprob: float | None, row=None) -> TokenOutput:
        return TokenOutput(seq.seq_id, token, logprob, seq.finish_reason, seq.num_prompt_tokens,
                           len(seq.output_token_ids), row)

    def generate(self, prompts: list[list[int]], sampling: SamplingParams | list[SamplingParams],
                 max_steps: int = 1_000_000) -> dict[int, list[TokenOutput]]:
        """Run prompts to completion in-process (tests and benchmarks); outputs per request index."""
        params = sampling if isinstance(sampling, list) else [sampling] * len(prompts)
        for i, (prompt, p) in enumerate(zip(prompts, params)):
            self.add_request(i, prompt, p)
        results: dict[int, list[TokenOutput]] = {i: [] for i in range(len(prompts))}
        for _ in range(max_steps):
            if not self.has_unfinished():
                return results
            for out in self.step():
                results[out.seq_id].append(out)
        raise RuntimeError(f"requests unfinished after {max_steps} steps")
