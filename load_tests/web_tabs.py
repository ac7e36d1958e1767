"""Two extra tabs in Locust's web UI ("Tokens" and "Open loop"), fed with the rows of
token_stats and open_loop on every stats poll, with CSV downloads beside Locust's own."""
from __future__ import annotations

import csv
import io
import json

from . import open_loop, token_stats

TOKEN_COLUMNS = [("requests", "Requests"), ("output_tokens", "Output tokens"), ("output_tokens_per_s", "Tokens/s"),
                 ("ttft_p50_ms", "TTFT p50 (ms)"), ("ttft_p90_ms", "TTFT p90"), ("ttft_p99_ms", "TTFT p99"),
                 ("tpot_p50_ms", "TPOT p50 (ms)"), ("tpot_p99_ms", "TPOT p99"),
                 ("itl_p50_ms", "ITL p50 (ms)"), ("itl_p90_ms", "ITL p90"), ("itl_p99_ms", "ITL p99"),
                 ("e2e_p50_ms", "E2E p50 (ms)"), ("e2e_p99_ms", "E2E p99")]
OPEN_LOOP_COLUMNS = [("target_rate_per_s", "Target req/s"), ("achieved_rate_per_s", "Achieved req/s"),
                     ("scheduled", "Scheduled"), ("sent", "Sent"), ("late", "Late"), ("max_late_ms", "Max late (ms)"),
                     ("cap_hits", "Waited at cap"), ("num_users", "Users (cap)"), ("elapsed_s", "Elapsed (s)")]


def _token_rows(environment) -> list[dict]:
    stats = token_stats.for_environment(environment)
    return [{**row, "safe_name": row["name"]} for row in (stats.rows() if stats else [])]


def _open_loop_rows(environment) -> list[dict]:
    rows = [{k: round(v, 2) if isinstance(v, float) else v for k, v in s.to_dict().items()}
            for s in open_loop.stats(environment)]
    return [{**row, "safe_name": row["name"]} for row in rows]


def _csv(rows: list[dict]) -> str:
    out = io.StringIO()
    if rows:
        writer = csv.DictWriter(out, fieldnames=[k for k in rows[0] if k != "safe_name"], extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return out.getvalue()


def attach(environment) -> None:
    web_ui = environment.web_ui
    if web_ui is None or web_ui.template_args.get("batchwise_tabs"):
        return
    from flask import make_response, request

    def table(key, columns):
        return {"key": key, "structure": [{"key": "name", "title": "Name"}] +
                [{"key": k, "title": title} for k, title in columns]}

    web_ui.template_args.update({
        "batchwise_tabs": True,
        "extended_tabs": [{"title": "Tokens", "key": "tokens"}, {"title": "Open loop", "key": "open-loop"}],
        "extended_tables": [table("tokens", TOKEN_COLUMNS), table("open-loop", OPEN_LOOP_COLUMNS)],
        "extended_csv_files": [{"href": "/tokens/csv", "title": "Download token statistics CSV"},
                               {"href": "/open-loop/csv", "title": "Download open-loop statistics CSV"}],
    })

    @web_ui.app.after_request
    def add_extended_stats(response):
        if request.path.endswith("/stats/requests") and response.is_json:
            extended = [{"key": "tokens", "data": _token_rows(environment)},
                        {"key": "open-loop", "data": _open_loop_rows(environment)}]
            response.set_data(json.dumps({**response.json, "extended_stats": extended}))
        return response

    def download(rows, name):
        response = make_response(_csv(rows))
        response.headers["Content-type"] = "text/csv"
        response.headers["Content-disposition"] = f"attachment;filename={name}.csv"
        return response

    web_ui.app.add_url_rule("/tokens/csv", "batchwise_tokens_csv",
                            lambda: download(_token_rows(environment), "tokens"))
    web_ui.app.add_url_rule("/open-loop/csv", "batchwise_open_loop_csv",
                            lambda: download(_open_loop_rows(environment), "open_loop"))
