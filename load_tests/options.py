"""Command-line (and web UI) settings of the users, as Locust custom arguments: each one overrides a
class attribute of the locustfile's User class. Applied at init and again at every test start, so that
workers take the master's values and a start from the web UI takes the form's."""
from __future__ import annotations

from .arrivals import DISTRIBUTIONS
from .instrument import attach


def _optional_int(value):
    return None if value in (None, "", "None") else int(value)


def _arrival_window(value):
    """Seconds to pin over; "auto" (or None) for 20 arrivals and at least 1 s; 0 or blank: unpinned."""
    if value in (None, "auto", "None"):
        return None
    return 0.0 if value == "" else float(value)


def _optional_str(value):
    return None if value in (None, "", "None") else str(value)


# option dest -> (class attribute, converter, help)
SETTINGS = {
    "model": ("model", str, "served model to call (embed users: embed or minilm; generation: gpt2 or gpt2_static)"),
    "workload": ("workload", _optional_str, "workload file from `python -m load_tests.workload` (default: made "
                 "in memory, seed --workload-seed)"),
    "workload_order": ("workload_order", str, "round-robin or random (seeded) record order"),
    "workload_seed": ("workload_seed", int, "seed of the in-memory workload and of the random order"),
    "priority": ("priority", int, "Triton request priority (0: the model's default level; 1 is the highest)"),
    "request_timeout": ("timeout_s", float, "client timeout per request, seconds"),
    "max_tokens": ("max_tokens", _optional_int, "generation: output tokens per request (default: the workload's)"),
    "arrival_rate": ("arrival_rate", float, "open loop: requests/s for the whole run, split across processes "
                     "(0: closed loop, each user sends its next request when the last one ends)"),
    "arrival_distribution": ("arrival_distribution", str, f"open loop: interarrival distribution, {DISTRIBUTIONS}"),
    "arrival_cv": ("arrival_cv", float, "open loop, gamma: coefficient of variation of the gaps (>1: bursty)"),
    "arrival_seed": ("arrival_seed", int, "open loop: seed of the arrival times"),
    "arrival_window": ("arrival_window_s", _arrival_window, "open loop, opt-in variance reduction: pin the "
                       "arrival count to the rate over windows of this many seconds (auto: 20 arrivals, at least "
                       "1 s), which hides the count's own variance and so understates queueing at that time "
                       "scale and above; 0: the unpinned Poisson/gamma process"),
    "late_threshold_ms": ("late_threshold_ms", float, "open loop: a dispatch later than this counts as late"),
}


def add_arguments(parser, user_class) -> None:
    group = parser.add_argument_group("batchwise", "settings of the batchwise users (class attributes)")
    for dest, (attribute, _, text) in SETTINGS.items():
        if hasattr(user_class, attribute):
            default = getattr(user_class, attribute)
            group.add_argument(f"--{dest.replace('_', '-')}", dest=dest, default=default,
                               type=SETTINGS[dest][1], help=f"{text} (default: %(default)s)")


def apply(user_class, parsed_options) -> None:
    if parsed_options is None:
        return
    for dest, (attribute, convert, _) in SETTINGS.items():
        if hasattr(user_class, attribute) and hasattr(parsed_options, dest):
            setattr(user_class, attribute, convert(getattr(parsed_options, dest)))


def install(events, user_class) -> None:
    """What a locustfile calls once: its settings on the command line and in the web UI, and the
    token stats, open-loop counters, web UI tabs and end-of-run report on its environment."""

    @events.init_command_line_parser.add_listener
    def _add_arguments(parser, **_kw):
        add_arguments(parser, user_class)

    @events.init.add_listener
    def _on_init(environment, **_kw):
        apply(user_class, environment.parsed_options)
        attach(environment)

    @events.test_start.add_listener
    def _on_test_start(environment, **_kw):
        apply(user_class, environment.parsed_options)
