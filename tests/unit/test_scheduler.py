"""The engine config and the scheduler: each scheduling rule on a hand-built case, then a fake engine
loop (no model: a fake KV cache whose "sampled" token is a function of what the cache holds) driven by
hypothesis through random arrivals, aborts and caches small enough to force preemption."""
from collections import Counter
from dataclasses import dataclass, replace

import numpy as np
import pytest
from hypothesis import assume, event, given, settings, target
from hypothesis import strategies as st

from backends.continuous_decoding.engine.batch import build_batch
from backends.continuous_decoding.engine.block_manager import BlockManager
from backends.continuous_decoding.engine.config import MIB, ConfigError, EngineConfig
from backends.continuous_decoding.engine.sampling_params import InvalidRequest, SamplingParams
from backends.continuous_decoding.engine.scheduler import Scheduler
from backends.continuous_decoding.engine.sequence import FinishReason, Sequence, SequenceStatus

VOCAB = 50


# ---------------------------------------------------------------- config

def test_config_defaults():
    config = EngineConfig.from_parameters({})
    assert config == EngineConfig()
    assert (config.block_size, config.kv_cache_bytes, config.max_num_seqs) == (16, 256 * MIB, 64)
    assert (config.max_num_batched_tokens, config.max_model_len) == (512, 1024)
    assert config.enable_chunked_prefill and not config.enable_priority and config.scheduling == "continuous"


def test_config_parses_triton_string_parameters():
    config = EngineConfig.from_parameters({
        "block_size": "8", "kv_cache_bytes": "1048576", "max_num_seqs": "4", "max_num_batched_tokens": " 64 ",
        "max_model_len": "64", "enable_chunked_prefill": "False", "scheduling": "static", "enable_priority": "1"})
    assert config == EngineConfig(block_size=8, kv_cache_bytes=MIB, max_num_seqs=4, max_num_batched_tokens=64,
                                  max_model_len=64, enable_chunked_prefill=False, scheduling="static",
                                  enable_priority=True)


@pytest.mark.parametrize("params, match", [
    ({"blocksize": "16"}, r"'blocksize': unknown; the engine takes block_size, kv_cache_bytes"),
    ({"block_size": "sixteen"}, r"'block_size': must be an integer in \[1, 1024\], got 'sixteen'"),
    ({"block_size": "0"}, r"'block_size': must be an integer in \[1, 1024\], got 0"),
    ({"max_num_seqs": "1.5"}, r"'max_num_seqs': must be an integer"),
    ({"kv_cache_bytes": "-1"}, r"'kv_cache_bytes': must be an integer in \[1, "),
    ({"enable_priority": "maybe"}, r"'enable_priority': must be true or false, got 'maybe'"),
    ({"scheduling": "dynamic"}, r"'scheduling': must be one of continuous, static, got 'dynamic'"),
    ({"max_num_seqs": "64", "max_num_batched_tokens": "32"},
     r"'max_num_batched_tokens': must be >= max_num_seqs \(64\), got 32"),
    ({"enable_chunked_prefill": "false", "max_model_len": "1024", "max_num_batched_tokens": "512"},
     r"'max_num_batched_tokens': must be >= max_model_len \(1024\) when enable_chunked_prefill is false"),
])
def test_config_rejects_bad_parameters_naming_the_field(params, match):
    with pytest.raises(ConfigError, match=match) as info:
        EngineConfig.from_parameters(params)
    assert isinstance(info.value, ValueError)


def test_config_validates_direct_construction_too():
    with pytest.raises(ConfigError, match="'max_model_len'"):
        EngineConfig(max_model_len=0)


def test_num_kv_blocks_follows_the_byte_budget():
    # One block: K and V, 2 layers, 4 tokens, hidden 8, float32 = 2*2*4*8*4 = 512 bytes.
    config = EngineConfig(block_size=4, kv_cache_bytes=512 * 10 + 511)
    assert config.num_kv_blocks(num_layers=2, hidden_size=8) == 10
    with pytest.raises(ConfigError, match=r"'kv_cache_bytes': 511 bytes hold no KV block.*needs 512 bytes"):
        EngineConfig(block_size=4, kv_cache_bytes=511).num_kv_blocks(num_layers=2, hidden_size=8)


# ---------------------------------------------------------------- scheduling rules, by hand

def make_scheduler(num_blocks=64, **overrides) -> Scheduler:
    config = EngineConfig(**{"block_size": 4, "max_num_seqs": 8, "max_num_batched_tokens": 64,
                             "max_model_len": 64, **overrides})
    return Scheduler(config, BlockManager(num_blocks, config.block_size))


def make_seq(seq_id, num_prompt_tokens, max_tokens=4, priority=0, arrival_s=None) -> Sequence:
    prompt = [(seq_id * 7 + i) % VOCAB for i in range(num_prompt_tokens)]
    return Sequence(seq_id, prompt, SamplingParams(max_tokens=max_tokens),
                    arrival_s=float(seq_id) if arrival_s is None else arrival_s, priority=priority)


def step(sched: Scheduler):
    """One engine step with a constant sampler: schedule, mark computed, sample, finish at max_tokens."""
    out = sched.schedule()
    for row in sched.on_step_done(out):
        seq = out.scheduled[row].seq
        seq.output_token_ids.append(1)
        if len(seq.output_token_ids) == seq.sampling.max_tokens:
            sched.finish(seq, FinishReason.LENGTH)
    return out


def planned(out) -> list[tuple[int, int]]:
    return [(s.seq.seq_id, s.num_new_tokens) for s in out.scheduled]


def test_decodes_come_first_then_prefill_chunks():
    sched = make_scheduler()
    sched.add(make_seq(0, 3))
    sched.add(make_seq(1, 5))
    step(sched)
    sched.add(make_seq(2, 6))
    out = step(sched)
    assert planned(out) == [(0, 1), (1, 1), (2, 6)]
    assert out.num_batched_tokens == 8


def test_a_decode_goes_before_the_prefill_chunk_of_an_older_or_more_urgent_sequence():
    sched = make_scheduler(max_num_batched_tokens=8, max_num_seqs=2, enable_priority=True)
    relaxed, urgent = make_seq(0, 2, priority=1), make_seq(1, 20, priority=0)
    sched.add(relaxed)
    step(sched)
    sched.add(urgent)
    assert planned(step(sched)) == [(0, 1), (1, 7)]
    assert [s.seq_id for s in sched.running] == [1, 0]  # urgent ranks first, yet decodes lead the batch
    assert planned(step(sched)) == [(0, 1), (1, 7)]


def test_the_token_budget_splits_prompts_into_chunks_and_only_the_last_one_samples():
    sched = make_scheduler(max_num_batched_tokens=8, max_num_seqs=2)
    sched.add(make_seq(0, 10))
    sched.add(make_seq(1, 5))
    out = sched.schedule()
    assert planned(out) == [(0, 8)]
    assert sched.on_step_done(out) == []
    out = sched.schedule()  # the rest of seq 0's prompt, then a chunk of seq 1 in what is left
    assert planned(out) == [(0, 2), (1, 5)]
    assert out.num_batched_tokens == 7
    assert sched.on_step_done(out) == [0, 1]


def test_the_token_budget_counts_decodes():
    sched = make_scheduler(max_num_batched_tokens=8, max_num_seqs=2)
    sched.add(make_seq(0, 2))
    step(sched)
    sched.add(make_seq(1, 20))
    assert planned(step(sched)) == [(0, 1), (1, 7)]


def test_max_num_seqs_caps_the_running_sequences():
    sched = make_scheduler(max_num_seqs=2)
    for i in range(3):
        sched.add(make_seq(i, 2, max_tokens=2))
    assert planned(step(sched)) == [(0, 2), (1, 2)]
    assert [s.seq_id for s in sched.waiting] == [2]
    step(sched)  # both finish at their second token, which frees two places
    assert planned(step(sched)) == [(2, 2)]


def test_without_chunked_prefill_a_prompt_runs_whole_or_waits_and_is_not_overtaken():
    sched = make_scheduler(enable_chunked_prefill=False, max_num_batched_tokens=10, max_model_len=10)
    sched.add(make_seq(0, 6))
    sched.add(make_seq(1, 6))
    sched.add(make_seq(2, 2))
    assert planned(step(sched)) == [(0, 6)]
    assert planned(step(sched)) == [(0, 1), (1, 6), (2, 2)]


def test_preemption_frees_the_victim_keeps_its_outputs_and_queues_it_first():
    sched = make_scheduler(num_blocks=2)
    old, new = make_seq(0, 4, max_tokens=4), make_seq(1, 4, max_tokens=4)
    sched.add(old)
    sched.add(new)
    sched.add(make_seq(2, 1))
    step(sched)  # old and new: one full block each; seq 2 does not fit
    out = step(sched)  # old's decode needs a third block: new, the newest, is preempted
    assert planned(out) == [(0, 1)]
    assert out.preempted == (new,)
    assert new.status is SequenceStatus.WAITING and new.block_table == [] and new.num_computed_tokens == 0
    assert new.output_token_ids == [1] and new.num_preemptions == 1
    assert [s.seq_id for s in sched.waiting] == [1, 2]
    sched.block_manager.check_invariants(sched.running)


def test_a_preempted_sequence_resumes_by_recomputing_prompt_and_outputs():
    sched = make_scheduler(num_blocks=2)
    old, new = make_seq(0, 4, max_tokens=3), make_seq(1, 4, max_tokens=3)
    sched.add(old)
    sched.add(new)
    step(sched)
    step(sched)  # new preempted with one output token
    step(sched)  # old finishes with its third token and frees its blocks
    assert old.is_finished
    out = step(sched)
    assert planned(out) == [(1, 5)]  # 4 prompt tokens + 1 output, as one prefill
    assert new.output_token_ids == [1, 1]  # and the recompute samples the next token, not a duplicate


def test_the_sequence_needing_a_block_is_preempted_itself_when_it_is_the_newest():
    sched = make_scheduler(num_blocks=2)
    old, new = make_seq(0, 3, max_tokens=4), make_seq(1, 4, max_tokens=4)
    sched.add(old)
    sched.add(new)
    step(sched)
    out = step(sched)  # old's token 4 fits its block; new's token 5 needs one, and new is the newest
    assert planned(out) == [(0, 1)]
    assert out.preempted == (new,)


def test_a_newer_sequence_already_scheduled_this_step_is_unscheduled_to_make_room():
    sched = make_scheduler(num_blocks=3, block_size=2, max_num_batched_tokens=3, max_num_seqs=2,
                           enable_priority=True)
    relaxed, urgent = make_seq(0, 2, max_tokens=5, priority=1), make_seq(1, 4, max_tokens=1, priority=0)
    sched.add(relaxed)
    step(sched)
    sched.add(urgent)
    assert planned(step(sched)) == [(0, 1), (1, 2)]
    out = step(sched)  # relaxed's decode is planned first, then urgent's chunk needs its block
    assert planned(out) == [(1, 2)] and out.preempted == (relaxed,)
    assert out.num_batched_tokens == 2 and relaxed.num_computed_tokens == 0


def test_no_waiting_sequence_joins_in_a_step_that_preempted():
    sched = make_scheduler(num_blocks=3, max_num_batched_tokens=4, max_num_seqs=2)
    old, new = make_seq(0, 4), make_seq(1, 8)
    sched.add(old)
    sched.add(new)
    assert planned(step(sched)) == [(0, 4)]
    assert planned(step(sched)) == [(0, 1), (1, 3)]
    out = step(sched)  # new's next chunk needs a third block: new, the newest, goes
    assert planned(out) == [(0, 1)] and out.preempted == (new,)
    # A 3-token chunk of new would fit the block it freed, yet it waits for the next step.
    assert sched.block_manager.num_free_blocks == 1 and list(sched.waiting) == [new]
    assert planned(step(sched)) == [(0, 1), (1, 3)]


@pytest.mark.parametrize("enable_priority, order", [(True, [2, 0, 1]), (False, [0, 1, 2])])
def test_priority_orders_the_waiting_queue_only_when_enabled(enable_priority, order):
    sched = make_scheduler(max_num_seqs=1, enable_priority=enable_priority, max_num_batched_tokens=8)
    for seq_id, priority in [(0, 1), (1, 1), (2, 0)]:
        sched.add(make_seq(seq_id, 2, max_tokens=1, priority=priority))
    assert [planned(step(sched))[0][0] for _ in range(3)] == order


@pytest.mark.parametrize("enable_priority", [True, False])
def test_with_priority_the_lowest_priority_running_sequence_is_preempted_first(enable_priority):
    sched = make_scheduler(num_blocks=2, enable_priority=enable_priority)
    urgent = make_seq(0, 4, max_tokens=4, priority=0, arrival_s=5.0)
    relaxed = make_seq(1, 4, max_tokens=4, priority=1, arrival_s=0.0)
    sched.add(relaxed)
    sched.add(urgent)
    step(sched)
    out = step(sched)
    assert out.preempted == ((relaxed,) if enable_priority else (urgent,))


def test_static_scheduling_admits_nothing_until_the_whole_batch_has_finished():
    sched = make_scheduler(scheduling="static", max_num_seqs=2)
    sched.add(make_seq(0, 2, max_tokens=1))
    sched.add(make_seq(1, 2, max_tokens=3))
    sched.add(make_seq(2, 2, max_tokens=1))
    assert planned(step(sched)) == [(0, 2), (1, 2)]  # seq 0 finishes at once, its place stays empty
    assert planned(step(sched)) == [(1, 1)]
    assert planned(step(sched)) == [(1, 1)]
    assert planned(step(sched)) == [(2, 2)]


def test_static_scheduling_admits_a_batch_only_as_large_as_its_full_lengths_fit():
    sched = make_scheduler(scheduling="static", num_blocks=4)
    for i in range(3):
        sched.add(make_seq(i, 4, max_tokens=5))  # 8 KV tokens = 2 blocks each
    step(sched)
    assert [s.seq_id for s in sched.running] == [0, 1] and [s.seq_id for s in sched.waiting] == [2]


def test_static_scheduling_still_respects_the_token_budget():
    sched = make_scheduler(scheduling="static", max_num_batched_tokens=8, max_num_seqs=2)
    sched.add(make_seq(0, 6))
    sched.add(make_seq(1, 6))
    assert planned(step(sched)) == [(0, 6), (1, 2)]


@pytest.mark.parametrize("num_prompt, max_tokens, num_blocks, field, match", [
    (0, 4, 64, "prompt", "must hold at least one token"),
    (64, 4, 64, "prompt", "64 tokens leave no room to generate within max_model_len=64; at most 63"),
    (60, 8, 64, "max_tokens", r"prompt \(60 tokens\) \+ max_tokens \(8\) exceeds max_model_len=64; at most 4"),
    (13, 1, 3, "prompt", r"13 tokens need more KV blocks than the whole cache holds \(3 blocks of 4 tokens\)"),
    (10, 4, 3, "max_tokens", r"need more KV blocks than the whole cache holds \(3 blocks of 4 tokens\); at most 3"),
])
def test_add_refuses_what_could_never_run(num_prompt, max_tokens, num_blocks, field, match):
    sched = make_scheduler(num_blocks=num_blocks)
    with pytest.raises(InvalidRequest, match=match) as info:
        sched.add(make_seq(0, num_prompt, max_tokens=max_tokens))
    assert info.value.field == field
    assert not sched.has_unfinished()


def test_the_largest_request_the_cache_holds_is_accepted_and_runs():
    sched = make_scheduler(num_blocks=3)
    seq = make_seq(0, 10, max_tokens=3)  # 12 KV tokens: the last sampled one needs no slot
    sched.add(seq)
    while sched.has_unfinished():
        step(sched)
    assert seq.output_token_ids == [1, 1, 1]


def test_abort_removes_a_sequence_from_either_queue_and_frees_its_blocks():
    sched = make_scheduler(max_num_seqs=1)
    running, waiting = make_seq(0, 6), make_seq(1, 6)
    sched.add(running)
    sched.add(waiting)
    step(sched)
    assert sched.abort(0) is running and sched.abort(1) is waiting
    for seq in (running, waiting):
        assert seq.status is SequenceStatus.FINISHED and seq.finish_reason is FinishReason.CANCELLED
        assert seq.block_table == []
    assert sched.block_manager.num_free_blocks == 64 and not sched.has_unfinished()
    assert sched.abort(0) is None and sched.abort(99) is None


def test_a_sequence_aborted_while_its_step_runs_is_skipped_by_on_step_done():
    sched = make_scheduler()
    seq = make_seq(0, 6)
    sched.add(seq)
    out = sched.schedule()
    sched.abort(0)
    assert sched.on_step_done(out) == []
    assert seq.num_computed_tokens == 0


def test_finish_removes_the_sequence_at_once_and_cannot_happen_twice():
    sched = make_scheduler()
    seq = make_seq(0, 6)
    sched.add(seq)
    sched.on_step_done(sched.schedule())
    sched.finish(seq, FinishReason.STOP)
    assert not sched.running and sched.block_manager.num_used_blocks == 0
    assert seq.finish_reason is FinishReason.STOP
    with pytest.raises(RuntimeError, match="already finished"):
        sched.finish(seq, FinishReason.STOP)


def test_the_block_sizes_of_config_and_manager_must_agree():
    with pytest.raises(ValueError, match="block_size differs: config 16, block manager 8"):
        Scheduler(EngineConfig(), BlockManager(4, 8))


# ---------------------------------------------------------------- a fake engine, driven by hypothesis

MAX_STEPS = 2000  # far above what any drawn scenario needs; reaching it means a livelock


def next_token(context: np.ndarray) -> int:
    """The fake model: a deterministic function of the whole context (a polynomial hash)."""
    weights = np.arange(1, context.shape[0] + 1, dtype=np.int64)
    return int((context * weights).sum() % VOCAB)


def reference_output(prompt: list[int], max_tokens: int, stop_token_ids: tuple[int, ...]) -> list[int]:
    """What a sequence must produce, computed alone with no cache, no batch, no preemption."""
    tokens, output = list(prompt), []
    while len(output) < max_tokens:
        token = next_token(np.asarray(tokens, dtype=np.int64))
        tokens.append(token)
        output.append(token)
        if token in stop_token_ids:
            break
    return output


class FakeRunner:
    """Writes each new token into its cache slot, then reads every sequence's context back through
    its block table: a block shared by two live sequences, or a stale block after a preemption,
    changes what is read and so the sampled token."""

    def __init__(self, num_blocks: int, block_size: int):
        self.block_size = block_size
        self.cache = np.full(num_blocks * block_size, -1, dtype=np.int64)  # [num_slots] token ids

    def run(self, batch) -> list[int]:
        self.cache[batch.slot_mapping] = batch.token_ids
        tokens = []
        for context_len, block_table in zip(batch.context_lens, batch.block_tables):
            positions = np.arange(context_len)
            slots = np.asarray(block_table)[positions // self.block_size] * self.block_size \
                + positions % self.block_size
            tokens.append(next_token(self.cache[slots]))
        return tokens


class CountingBlockManager(BlockManager):
    def __init__(self, num_blocks, block_size):
        super().__init__(num_blocks, block_size)
        self.allocated, self.freed = Counter(), Counter()

    def allocate(self, seq, num_new_tokens):
        before = len(seq.block_table)
        super().allocate(seq, num_new_tokens)
        self.allocated.update(seq.block_table[before:])

    def free(self, seq):
        self.freed.update(seq.block_table)
        super().free(seq)


@dataclass(frozen=True)
class Request:
    arrival_step: int
    prompt: tuple[int, ...]
    max_tokens: int
    priority: int
    stop_token_ids: tuple[int, ...]
    abort_step: int | None
    abort_while_running: bool  # between schedule() and on_step_done(), rather than before schedule()


@dataclass
class Run:
    seqs: dict[int, Sequence]
    refused: dict[int, InvalidRequest]
    num_preemptions: int
    plans: list[list[tuple[int, int]]]  # per step, (seq_id, num_new_tokens) in batch order


def drive(config: EngineConfig, num_blocks: int, requests: list[Request]) -> Run:
    """The engine loop with the fake runner, checking the scheduler's invariants after every step."""
    bm = CountingBlockManager(num_blocks, config.block_size)
    sched = Scheduler(config, bm)
    runner = FakeRunner(num_blocks, config.block_size)
    seqs, refused = {}, {}
    computed, recomputed = Counter(), Counter()  # tokens run through the model, per seq_id
    num_preemptions = 0
    plans = []
    last_arrival = max(r.arrival_step for r in requests)
    for step_index in range(MAX_STEPS):
        for seq_id, req in enumerate(requests):
            if req.arrival_step == step_index:
                seq = Sequence(seq_id, list(req.prompt), SamplingParams(
                    max_tokens=req.max_tokens, stop_token_ids=req.stop_token_ids),
                    arrival_s=float(step_index), priority=req.priority)
                try:
                    sched.add(seq)
                    seqs[seq_id] = seq
                except InvalidRequest as error:
                    refused[seq_id] = error
            if req.abort_step == step_index and not req.abort_while_running:
                check_abort(sched, seq_id)
        if not sched.has_unfinished():
            if step_index >= last_arrival:
                break
            continue
        was_running = list(sched.running)
        computed_before = {s.seq_id: s.num_computed_tokens for s in was_running}
        out = sched.schedule()
        check_output(sched, out, was_running)
        plans.append(planned(out))
        for seq in out.preempted:
            recomputed[seq.seq_id] += computed_before[seq.seq_id]
        num_preemptions += len(out.preempted)
        # The oldest running sequence always fits once the newer ones are preempted, and with none
        # running the head of the queue fits an empty cache: a step with nothing to run is a stall.
        assert not out.is_empty, "unfinished sequences, yet nothing scheduled"
        batch = build_batch(out.batch_rows(), config.block_size)
        check_batch(out, batch, config.block_size)
        sampled = runner.run(batch)
        for seq_id, req in enumerate(requests):
            if req.abort_step == step_index and req.abort_while_running:
                check_abort(sched, seq_id)
        rows = sched.on_step_done(out)
        for item in out.scheduled:
            computed[item.seq.seq_id] += item.num_new_tokens
        assert rows == [i for i, s in enumerate(out.scheduled)
                        if not s.seq.is_finished and s.seq.num_computed_tokens == s.seq.num_tokens]
        for row in rows:
            seq = out.scheduled[row].seq
            seq.output_token_ids.append(sampled[row])
            if sampled[row] in seq.sampling.stop_token_ids:
                sched.finish(seq, FinishReason.STOP)
            elif len(seq.output_token_ids) == seq.sampling.max_tokens:
                sched.finish(seq, FinishReason.LENGTH)
        bm.check_invariants(list(sched.running) + list(sched.waiting))
    else:
        pytest.fail(f"not finished after {MAX_STEPS} steps: a livelock or a lost sequence")

    assert bm.num_free_blocks == num_blocks
    assert bm.allocated == bm.freed, "a block was freed a different number of times than it was handed out"
    for seq in seqs.values():
        assert seq.is_finished and seq.block_table == []
        if seq.finish_reason is not FinishReason.CANCELLED:
            # The last sampled token is never run; a preemption reruns what it had computed.
            assert computed[seq.seq_id] == seq.num_tokens - 1 + recomputed[seq.seq_id]
    return Run(seqs, refused, num_preemptions, plans)


def check_abort(sched: Scheduler, seq_id: int) -> None:
    seq = sched.abort(seq_id)
    if seq is not None:
        assert seq.finish_reason is FinishReason.CANCELLED and seq.block_table == []
        assert seq not in sched.running and seq not in sched.waiting


def check_output(sched: Scheduler, out, was_running: list[Sequence]) -> None:
    config = sched.config
    items = out.scheduled
    assert out.num_batched_tokens == sum(s.num_new_tokens for s in items) <= config.max_num_batched_tokens
    assert len(sched.running) <= config.max_num_seqs
    assert len({id(s.seq) for s in items}) == len(items), "a sequence scheduled twice in one step"
    for item in items:
        seq = item.seq
        assert seq.status is SequenceStatus.RUNNING and seq in sched.running
        assert 1 <= item.num_new_tokens <= seq.num_uncomputed_tokens
        if not config.enable_chunked_prefill:
            assert item.num_new_tokens == seq.num_uncomputed_tokens
    # Decodes of running sequences, then their prefill chunks, then newcomers.
    phase = [0 if s.seq in was_running and not s.seq.is_prefill else 1 if s.seq in was_running else 2
             for s in items]
    assert phase == sorted(phase)
    joined = [s.seq for s in items if s.seq not in was_running]
    if config.scheduling == "static":
        assert not out.preempted, "a static batch is sized so that it never preempts"
        assert not joined or not was_running, "a static batch admitted a newcomer before it finished"
    else:
        assert not (joined and out.preempted), "a newcomer joined in a step that preempted"
    for seq in out.preempted:
        assert seq in was_running and seq.status is SequenceStatus.WAITING
        assert seq.block_table == [] and seq.num_computed_tokens == 0
        # Only sequences newer than every one kept running were preempted.
        kept = [s for s in sched.running if s in was_running]
        assert all(sched._order_key(s) < sched._order_key(seq) for s in kept)


def check_batch(out, batch, block_size: int) -> None:
    assert len(set(batch.slot_mapping.tolist())) == batch.num_tokens, "one slot written twice in a step"
    start = 0
    for item, num_new in zip(out.scheduled, batch.query_lens):
        seq, end = item.seq, start + num_new
        assert set((batch.slot_mapping[start:end] // block_size).tolist()) <= set(seq.block_table)
        first = seq.num_computed_tokens
        assert batch.token_ids[start:end].tolist() == seq.token_ids[first:first + num_new]
        start = end


@st.composite
def requests_for(draw, max_model_len: int) -> Request:
    # Mostly prompts that fit with room to generate; a few too long, to exercise refusals.
    max_prompt_len = draw(st.sampled_from([max_model_len // 2 + 1] * 4 + [max_model_len + 2]))
    prompt = draw(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=max_prompt_len))
    abort_step = draw(st.none() | st.none() | st.integers(0, 30))
    return Request(arrival_step=draw(st.integers(0, 5)), prompt=tuple(prompt),
                   max_tokens=draw(st.integers(1, max_model_len // 2 + 1)), priority=draw(st.integers(0, 2)),
                   stop_token_ids=draw(st.sampled_from([(), (0,), (3, 7)])),
                   abort_step=abort_step, abort_while_running=draw(st.booleans()))


@st.composite
def scenarios(draw, scheduling=st.sampled_from(["continuous", "continuous", "static"])):
    chunked = draw(st.booleans())
    max_num_seqs = draw(st.integers(1, 6))
    max_model_len = draw(st.integers(2, 32))
    low = max(max_num_seqs, 1 if chunked else max_model_len)
    config = EngineConfig(block_size=draw(st.sampled_from([1, 2, 4, 8])), max_num_seqs=max_num_seqs,
                          max_num_batched_tokens=draw(st.integers(low, low + 16)), max_model_len=max_model_len,
                          enable_chunked_prefill=chunked, scheduling=draw(scheduling),
                          enable_priority=draw(st.booleans()))
    # From a cache that holds about one long sequence to one that holds a few: the small end preempts.
    one_sequence = -(-max_model_len // config.block_size)
    num_blocks = draw(st.integers(max(1, one_sequence // 2), 2 * one_sequence))
    requests = draw(st.lists(requests_for(max_model_len), min_size=2, max_size=10))
    return config, num_blocks, requests


def fits(config: EngineConfig, num_blocks: int, req: Request) -> bool:
    kv_tokens = len(req.prompt) + req.max_tokens - 1
    return len(req.prompt) + req.max_tokens <= config.max_model_len \
        and -(-kv_tokens // config.block_size) <= num_blocks


@settings(max_examples=200, deadline=None)
@given(scenarios())
def test_random_workloads_keep_every_invariant_and_match_an_unbatched_reference(scenario):
    config, num_blocks, requests = scenario
    run = drive(config, num_blocks, requests)
    event(f"preempted: {run.num_preemptions > 0}")
    target(float(run.num_preemptions), label="preemptions")  # steer towards the tight-cache cases
    for seq_id, req in enumerate(requests):
        assert (seq_id in run.refused) != fits(config, num_blocks, req)
        seq = run.seqs.get(seq_id)
        if seq is not None and seq.finish_reason is not FinishReason.CANCELLED:
            assert seq.output_token_ids == reference_output(list(req.prompt), req.max_tokens, req.stop_token_ids)
        if seq is not None and req.abort_step is None:
            assert seq.finish_reason in (FinishReason.LENGTH, FinishReason.STOP)


@settings(max_examples=100, deadline=None)
@given(scenarios(scheduling=st.just("continuous")))
def test_a_preempted_sequence_produces_what_it_produces_in_a_cache_too_large_to_preempt(scenario):
    config, num_blocks, requests = scenario
    requests = [r for r in requests if fits(config, num_blocks, r) and r.abort_step is None] or requests[:0]
    if not requests:
        return
    small = drive(config, num_blocks, requests)
    large = drive(config, sum(-(-(len(r.prompt) + r.max_tokens) // config.block_size) for r in requests), requests)
    assert large.num_preemptions == 0
    event(f"preempted: {small.num_preemptions > 0}")
    target(float(small.num_preemptions), label="preemptions")
    for seq_id, seq in small.seqs.items():
        assert seq.output_token_ids == large.seqs[seq_id].output_token_ids


@settings(max_examples=200, deadline=None)
@given(scenarios(scheduling=st.just("static")), st.integers(0, 8))
def test_when_every_request_waits_at_once_and_fits_one_batch_both_policies_schedule_the_same_steps(
        scenario, spare_blocks):
    # A burst that one static batch holds leaves continuous batching no one to admit: the two
    # policies then run the same steps, and their throughputs can differ only by noise.
    config, num_blocks, requests = scenario
    config = replace(config, enable_chunked_prefill=True)
    # One-token prompts are left out: admitted whole, a static batch counts them among the decodes,
    # which go first, where continuous batching admits them after the other prompts' chunks.
    requests = [replace(r, arrival_step=0, abort_step=None) for r in requests
                if len(r.prompt) + r.max_tokens <= config.max_model_len and len(r.prompt) > 1][:config.max_num_seqs]
    assume(len(requests) >= 2)
    num_blocks = spare_blocks + sum(-(-(len(r.prompt) + r.max_tokens - 1) // config.block_size) for r in requests)
    static = drive(config, num_blocks, requests)
    continuous = drive(replace(config, scheduling="continuous"), num_blocks, requests)
    assert static.num_preemptions == continuous.num_preemptions == 0
    event(f"a prompt chunk runs after the first step: {any(n > 1 for p in static.plans[1:] for _, n in p)}")
    assert static.plans == continuous.plans


def test_a_small_cache_forces_preemptions_and_every_sequence_still_finishes_correctly():
    config = EngineConfig(block_size=2, max_num_seqs=4, max_num_batched_tokens=8, max_model_len=16)
    requests = [Request(i % 3, tuple(range(i, i + 5)), 8, 0, (), None, False) for i in range(8)]
    run = drive(config, num_blocks=8, requests=requests)
    assert run.num_preemptions > 0 and not run.refused
    for seq_id, req in enumerate(requests):
        assert run.seqs[seq_id].output_token_ids == reference_output(list(req.prompt), 8, ())
