"""Wires the batchwise additions into a Locust environment: token stats, open-loop counters, the web
UI tabs, and at the end of a `locust` run a printed summary plus <csv prefix>_tokens.csv and
<csv prefix>_open_loop.csv next to Locust's own CSV files."""
from __future__ import annotations

import weakref

from . import open_loop, token_stats, web_tabs

_attached: "weakref.WeakSet" = weakref.WeakSet()


def attach(environment) -> None:
    """Idempotent; the users call it from on_start, locustfiles from the init event."""
    if environment in _attached:
        return
    _attached.add(environment)
    stats = token_stats.attach(environment)
    open_loop.attach(environment)
    web_tabs.attach(environment)

    def on_quit(**_kw):
        from locust.runners import WorkerRunner

        if isinstance(environment.runner, WorkerRunner):
            return
        report(environment, stats)

    environment.events.quit.add_listener(on_quit)


def report(environment, stats: token_stats.TokenStats) -> None:
    rows = stats.rows()
    if rows:
        print("\nToken statistics (generation, from each request's send or scheduled time)")
        print(token_stats.format_table(rows))
    for s in open_loop.stats(environment):
        print(s.summary())
    prefix = getattr(environment.parsed_options, "csv_prefix", None)
    if prefix:
        token_stats.write_csv(stats, f"{prefix}_tokens.csv")
        open_loop.write_csv(environment, f"{prefix}_open_loop.csv")
