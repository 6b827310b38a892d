"""Prometheus metrics of a suite: one registry built from the suite's run results, written as a
textfile-collector file (node_exporter ``--collector.textfile.directory``) and/or pushed to a Pushgateway.

Every metric carries ``suite`` and ``scenario`` labels (timings also ``check``). Values describe the suite
that just ran, not all history (``mlchaos history`` is for trends); timings are the latest measurement of
that check in the suite. Alert on staleness with ``mlchaos_suite_last_run_timestamp_seconds``: a schedule
that stopped running writes nothing.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Gauge, generate_latest, push_to_gateway

from chaos.suite.store import derived_metrics, run_span

if TYPE_CHECKING:
    from chaos.run.result import RunResult

ENV_PUSHGATEWAY = "MLCHAOS_PUSHGATEWAY"
JOB = "mlchaos"
TEXTFILE_NAME = "mlchaos.prom"

# derived metric (chaos.suite.store.DERIVED_METRICS values) -> Prometheus gauge name and help
_TIMINGS = {
    "detection_latency_s": ("mlchaos_detection_latency_seconds", "seconds from a fault to its first detection"),
    "recovery_s": ("mlchaos_recovery_seconds", "seconds from a fault until training got past its step again"),
    "failover_s": ("mlchaos_failover_seconds", "seconds from a fault until a non-primary backend served ok"),
    "failback_s": ("mlchaos_failback_seconds", "seconds from a heal until the primary served ok again"),
}


class MetricsError(Exception):
    """The textfile could not be written or the Pushgateway refused or could not be reached."""


def suite_registry(
    suite: str, results: Sequence[RunResult], *, exit_code: int, started_ts: float, ended_ts: float | None = None
) -> CollectorRegistry:
    """A fresh registry describing one suite run: per scenario its last verdict (1 pass, 0 otherwise), pass
    ratio and run count over the suite, last run's end time and duration, the latest timing of each timing
    check; per suite its exit code, run count, start and end time."""
    registry = CollectorRegistry()
    scenario_labels = ["suite", "scenario"]

    def gauge(name: str, doc: str, labels: list[str]) -> Gauge:
        return Gauge(name, doc, labels, registry=registry)

    last_verdict = gauge(
        "mlchaos_scenario_last_verdict", "1 when the scenario's last run passed, else 0", scenario_labels
    )
    pass_ratio = gauge(
        "mlchaos_scenario_pass_ratio", "share of the scenario's runs in the suite that passed", scenario_labels
    )
    runs = gauge("mlchaos_scenario_runs", "runs of the scenario in the suite", scenario_labels)
    last_ts = gauge(
        "mlchaos_scenario_last_run_timestamp_seconds", "when the scenario's last run ended (Unix)", scenario_labels
    )
    last_duration = gauge("mlchaos_scenario_last_run_duration_seconds", "wall time of the last run", scenario_labels)
    timings = {key: gauge(name, doc, [*scenario_labels, "check"]) for key, (name, doc) in _TIMINGS.items()}

    by_scenario: dict[str, list[RunResult]] = {}
    for result in results:
        by_scenario.setdefault(result.scenario.name, []).append(result)
    for scenario, outcomes in by_scenario.items():
        latest = outcomes[-1]
        started, ended = run_span(latest)
        passed = sum(o.verdict == "pass" for o in outcomes)
        last_verdict.labels(suite, scenario).set(1 if latest.verdict == "pass" else 0)
        pass_ratio.labels(suite, scenario).set(passed / len(outcomes))
        runs.labels(suite, scenario).set(len(outcomes))
        last_ts.labels(suite, scenario).set(ended)
        last_duration.labels(suite, scenario).set(ended - started)
        for outcome in outcomes:  # in run order, so the latest measurement of each check wins
            for metric in derived_metrics(outcome.results):
                timings[metric.metric].labels(suite, scenario, metric.check).set(metric.value)

    gauge(
        "mlchaos_suite_exit_code",
        "the suite's exit code: 0 pass, 1 a check failed, 2 invalid, 3 harness error",
        ["suite"],
    ).labels(suite).set(exit_code)
    gauge("mlchaos_suite_runs", "runs the suite completed", ["suite"]).labels(suite).set(len(results))
    gauge("mlchaos_suite_passed_runs", "runs of the suite that passed", ["suite"]).labels(suite).set(
        sum(r.verdict == "pass" for r in results)
    )
    gauge("mlchaos_suite_start_timestamp_seconds", "when the suite started (Unix)", ["suite"]).labels(suite).set(
        started_ts
    )
    gauge("mlchaos_suite_last_run_timestamp_seconds", "when the suite ended (Unix)", ["suite"]).labels(suite).set(
        time.time() if ended_ts is None else ended_ts
    )
    return registry


def write_textfile(registry: CollectorRegistry, path: Path) -> None:
    """Write ``registry`` in the text exposition format to ``path`` atomically (temp file in the same folder,
    fsync, rename), so a collector scraping meanwhile sees the old file or the new one, never half of one."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with open(tmp, "wb") as handle:
            handle.write(generate_latest(registry))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        raise MetricsError(f"cannot write metrics to {path}: {exc}") from None


def pushgateway_url(option: str | None) -> str | None:
    """The Pushgateway to push to: the option when given, else ``$MLCHAOS_PUSHGATEWAY``, else None."""
    return option or os.environ.get(ENV_PUSHGATEWAY) or None


def push(registry: CollectorRegistry, url: str, suite: str, *, timeout: float = 10.0) -> None:
    """PUT ``registry`` to the Pushgateway at ``url`` as job ``mlchaos``, grouped by ``suite`` (so each suite's
    group is replaced as a whole and suites never overwrite each other)."""
    try:
        push_to_gateway(url, job=JOB, registry=registry, grouping_key={"suite": suite}, timeout=timeout)
    except (OSError, ValueError) as exc:  # URLError/HTTPError are OSErrors; a malformed URL is a ValueError
        raise MetricsError(f"push to Pushgateway {url} failed: {exc}") from None
