"""The engine's state as Triton custom metrics (beside Triton's own on /metrics): running and
waiting sequences, KV blocks in use, preemptions, generated tokens, and the size of each step."""


class EngineMetrics:
    """Updated by the engine thread after every step."""

    def __init__(self, pb_utils, model_name: str, num_kv_blocks: int):
        gauge, counter = pb_utils.MetricFamily.GAUGE, pb_utils.MetricFamily.COUNTER
        labels = {"model": model_name}

        # Triton refuses a Metric whose MetricFamily is gone, so the families live as long as we do.
        self._families = []

        def metric(name: str, description: str, kind):
            family = pb_utils.MetricFamily(name=name, description=description, kind=kind)
            self._families.append(family)
            return family.Metric(labels=labels)

        self.running = metric("batchwise_running_sequences", "Sequences in the running batch", gauge)
        self.waiting = metric("batchwise_waiting_sequences", "Sequences waiting to start or resume", gauge)
        self.kv_used = metric("batchwise_kv_blocks_used", "KV cache blocks in use", gauge)
        self.kv_total = metric("batchwise_kv_blocks_total", "KV cache blocks in the cache", gauge)
        self.step_seqs = metric("batchwise_step_batch_size", "Sequences in the last engine step", gauge)
        self.step_tokens = metric("batchwise_step_tokens", "Tokens in the last engine step", gauge)
        self.preemptions = metric("batchwise_preemptions_total", "Sequences preempted for KV blocks", counter)
        self.generated = metric("batchwise_generated_tokens_total", "Output tokens generated", counter)
        self.kv_total.set(num_kv_blocks)
        self._seen_preemptions = 0
        self._seen_generated = 0
        self._last: dict[int, int] = {}  # id(gauge) -> the value last set

    def update(self, engine) -> None:
        """Each set or increment is a message to the Triton process: only what changed is sent."""
        stats = engine.stats
        gauges = ((self.running, engine.num_running), (self.waiting, engine.num_waiting),
                  (self.kv_used, engine.block_manager.num_used_blocks),
                  (self.step_seqs, stats.last_step_num_seqs), (self.step_tokens, stats.last_step_num_tokens))
        for gauge, value in gauges:
            if self._last.get(id(gauge)) != value:
                gauge.set(value)
                self._last[id(gauge)] = value
        if stats.num_preemptions != self._seen_preemptions:
            self.preemptions.increment(stats.num_preemptions - self._seen_preemptions)
            self._seen_preemptions = stats.num_preemptions
        if stats.num_generated_tokens != self._seen_generated:
            self.generated.increment(stats.num_generated_tokens - self._seen_generated)
            self._seen_generated = stats.num_generated_tokens
