"""Temporal's own metrics on aiworker's ``/metrics``: a drained ``MetricBuffer``.

Temporal's worker and client metrics (and anything recorded through
``workflow.metric_meter()`` / ``activity.metric_meter()``, such as
``aiworker_pipelines``) are recorded by Core into a
:class:`temporalio.runtime.MetricBuffer`; :class:`SdkMetricsCollector` drains
it into the process's ``prometheus_client`` registry, so one ``/metrics``
port serves both aiworker's and the SDK's metrics. The alternative, the
SDK's ``PrometheusConfig``, needs a second port per pod and a second scrape
target; draining the buffer costs one small loop. Counters become
``<name>_total``; duration histograms (recorded in seconds) become
``<name>_seconds`` with aiworker's 5 ms .. 120 s buckets.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from temporalio.runtime import (
    BUFFERED_METRIC_KIND_COUNTER,
    BUFFERED_METRIC_KIND_GAUGE,
    BUFFERED_METRIC_KIND_HISTOGRAM,
    BufferedMetricUpdate,
    MetricBuffer,
)

from aiworker.activities.metrics import DURATION_BUCKETS

log = logging.getLogger("aiworker.telemetry")


@dataclass
class _Histogram:
    buckets: list[float]
    sum: float = 0.0
    count: int = 0


@dataclass
class _Family:
    name: str
    kind: int
    description: str
    values: dict[tuple[tuple[str, str], ...], float] = field(default_factory=dict)
    histograms: dict[tuple[tuple[str, str], ...], _Histogram] = field(default_factory=dict)


def _prom_name(raw: str, unit: str | None, kind: int) -> str:
    name = "".join(c if c.isalnum() or c == "_" else "_" for c in raw)
    if kind == BUFFERED_METRIC_KIND_COUNTER and name.endswith("_total"):
        name = name[: -len("_total")]
    if kind == BUFFERED_METRIC_KIND_HISTOGRAM and unit == "s" and not name.endswith("_seconds"):
        name += "_seconds"
    return name


class SdkMetricsCollector(Collector):
    """Drains a :class:`MetricBuffer` and exposes its metrics to ``prometheus_client``.

    The buffer is drained by a daemon thread (Core drops updates from a full
    buffer, so it must be drained whether or not anyone scrapes) and again on
    every scrape, so a scrape sees everything recorded before it.

    Args:
        buffer: the buffer set on the process's Temporal ``Runtime``.
        interval: seconds between background drains.
        buckets: histogram bucket bounds in seconds.
    """

    def __init__(
        self,
        buffer: MetricBuffer,
        *,
        interval: float = 1.0,
        buckets: tuple[float, ...] = DURATION_BUCKETS,
    ) -> None:
        self.buffer = buffer
        self.interval = interval
        self.bounds = [*buckets, math.inf]
        self._families: dict[str, _Family] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> SdkMetricsCollector:
        """Start draining in the background."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._loop, name="aiworker-sdk-metrics", daemon=True
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the background drain (after a last drain)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        self.drain()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.drain()

    def drain(self) -> None:
        """Apply every buffered update to the collected state."""
        with self._lock:
            try:
                updates = self.buffer.retrieve_updates()
            except Exception:
                log.exception(
                    "cannot drain Temporal SDK metrics",
                    extra={"aiworker": {"event": "sdk_metrics_drain_failed"}},
                )
                return
            for u in updates:
                self._apply(u)

    def _apply(self, u: BufferedMetricUpdate) -> None:
        m = u.metric
        name = _prom_name(m.name, m.unit, m.kind)
        fam = self._families.get(name)
        if fam is None:
            fam = self._families[name] = _Family(name, m.kind, m.description or m.name)
        labels = tuple(
            sorted(
                (
                    "".join(c if c.isalnum() or c == "_" else "_" for c in k),
                    str(v).lower() if isinstance(v, bool) else str(v),
                )
                for k, v in u.attributes.items()
            )
        )
        value = float(u.value)
        if fam.kind == BUFFERED_METRIC_KIND_COUNTER:
            fam.values[labels] = fam.values.get(labels, 0.0) + value
        elif fam.kind == BUFFERED_METRIC_KIND_GAUGE:
            fam.values[labels] = value
        elif fam.kind == BUFFERED_METRIC_KIND_HISTOGRAM:
            h = fam.histograms.get(labels)
            if h is None:
                h = fam.histograms[labels] = _Histogram([0.0] * len(self.bounds))
            for i, bound in enumerate(self.bounds):
                if value <= bound:
                    h.buckets[i] += 1
            h.sum += value
            h.count += 1

    def describe(self) -> Iterator[Metric]:
        # Names appear as the SDK records them; nothing to pre-declare.
        return iter(())

    def collect(self) -> Iterator[Metric]:
        self.drain()
        with self._lock:
            out: list[Metric] = []
            for fam in self._families.values():
                if fam.kind == BUFFERED_METRIC_KIND_COUNTER:
                    c = CounterMetricFamily(fam.name, fam.description)
                    for labels, v in fam.values.items():
                        c.add_sample(fam.name + "_total", dict(labels), v)
                    out.append(c)
                elif fam.kind == BUFFERED_METRIC_KIND_GAUGE:
                    g = GaugeMetricFamily(fam.name, fam.description)
                    for labels, v in fam.values.items():
                        g.add_sample(fam.name, dict(labels), v)
                    out.append(g)
                else:
                    hf = HistogramMetricFamily(fam.name, fam.description)
                    for labels, h in fam.histograms.items():
                        base = dict(labels)
                        for bound, n in zip(self.bounds, h.buckets, strict=True):
                            le = "+Inf" if math.isinf(bound) else repr(bound)
                            hf.add_sample(fam.name + "_bucket", {**base, "le": le}, n)
                        hf.add_sample(fam.name + "_count", base, h.count)
                        hf.add_sample(fam.name + "_sum", base, h.sum)
                    out.append(hf)
        return iter(out)
