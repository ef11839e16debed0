"""Per-core metrics: counters, the log2 latency histogram, snapshot files, Prometheus text, and the
supervisor's HTTP endpoint that serves them (broker/node/metrics_http.py)."""

from __future__ import annotations

import gc
import json
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from broker.core.metrics import (
    LATENCY_BUCKETS,
    CoreMetrics,
    percentile_us,
    prometheus_text,
    publish,
    read_snapshots,
)
from broker.node.metrics_http import bpf_prometheus_text, serve_metrics
from ringlog_proto.messages import ApiKey


def test_counters_and_the_latency_bucket_of_each_reply() -> None:
    mt = CoreMetrics(core=3, backend="uvloop")
    started = mt.request(ApiKey.PRODUCE, 100)
    mt.reply(30, started - 5_000_000)  # 5 ms ago: 5000 us has bit length 13
    mt.request(ApiKey.FETCH, 40)
    mt.request(999, 1)  # an unknown api lands in the last slot
    mt.forwarded()
    mt.forwarded_in()
    mt.error()
    snap = mt.snapshot({"inflight_requests": lambda: 7})
    assert snap["core"] == 3 and snap["backend"] == "uvloop"
    assert snap["requests"] == {"PRODUCE": 1, "FETCH": 1, "other": 1} and snap["requests_total"] == 3
    assert (snap["bytes_in"], snap["bytes_out"], snap["replies"]) == (141, 30, 1)
    assert (snap["forwarded"], snap["forwarded_in"], snap["errors"]) == (1, 1, 1)
    assert snap["gauges"] == {"inflight_requests": 7}
    hist = snap["latency_us_log2"]
    assert len(hist) == LATENCY_BUCKETS and hist[13] == 1 and sum(hist) == 1


def test_woken_fetches_and_the_wakes_for_nothing_are_counted_apart_for_followers() -> None:
    mt = CoreMetrics(core=0)
    mt.woken(replica=True, rewait=True)
    mt.woken(replica=True, rewait=False)
    mt.woken(replica=False, rewait=True)
    snap = mt.snapshot()
    assert (snap["replica_fetch_wakes"], snap["replica_fetch_rewaits"]) == (2, 1)
    assert (snap["long_poll_wakes"], snap["long_poll_rewaits"]) == (1, 1)
    assert 'ringlog_replica_fetch_rewaits_total{core="0"} 1' in prometheus_text([snap])


def test_a_follower_fetch_round_trip_lands_in_its_own_histogram() -> None:
    mt = CoreMetrics(core=0)
    mt.replica_fetched(time.monotonic_ns() - 3_000_000)  # 3 ms: bit length 12, not a request's latency
    snap = mt.snapshot()
    hist = snap["replica_fetch_us_log2"]
    assert len(hist) == LATENCY_BUCKETS and sum(hist) == 1 and hist[12] == 1
    assert percentile_us(hist, 0.5) == 4095 and sum(snap["latency_us_log2"]) == 0


def test_the_cyclic_collectors_collections_and_pauses_are_counted() -> None:
    mt = CoreMetrics(core=0)
    before = mt.snapshot()
    garbage: list[object] = []
    garbage.append(garbage)  # a cycle for it to free
    del garbage
    gc.collect()
    gc.collect(0)
    snap = mt.snapshot()
    full = snap["gc_collections"][2] - before["gc_collections"][2]
    young = snap["gc_collections"][0] - before["gc_collections"][0]
    assert full >= 1 and young >= 1
    assert snap["gc_pause_us_total"] > before["gc_pause_us_total"]
    assert 0 < snap["gc_pause_us_max"] <= snap["gc_pause_us_total"]
    text = prometheus_text([snap])
    assert f'ringlog_gc_collections_total{{core="0",generation="2"}} {snap["gc_collections"][2]}' in text
    assert f'ringlog_gc_pause_us_max{{core="0"}} {snap["gc_pause_us_max"]}' in text


def test_percentiles_are_bucket_upper_bounds() -> None:
    assert percentile_us([0] * 8, 0.5) == 0
    hist = [0] * 8
    hist[3] = 90  # 4..7 us
    hist[7] = 10  # 64..127 us
    assert percentile_us(hist, 0.5) == 7
    assert percentile_us(hist, 0.99) == 127
    assert percentile_us(hist, 0.9) == 7


def test_snapshots_round_trip_through_files_and_become_prometheus_text(tmp_path: Path) -> None:
    for core in (0, 1):
        mt = CoreMetrics(core)
        for _ in range(core + 1):
            mt.reply(10, mt.request(ApiKey.PRODUCE, 50))
        publish(str(tmp_path), mt.snapshot({"parked_long_polls": lambda: 2}))
    (tmp_path / "run" / "metrics-core-2.json").write_text("{torn")  # skipped, not fatal
    snaps = read_snapshots(str(tmp_path), 3)
    assert [s["core"] for s in snaps] == [0, 1]
    text = prometheus_text(snaps)
    assert 'ringlog_requests_total{core="1",api="PRODUCE"} 2' in text
    assert 'ringlog_bytes_in_total{core="0"} 50' in text
    assert 'ringlog_parked_long_polls{core="1"} 2' in text
    assert 'ringlog_request_latency_us_bucket{core="1",le="+Inf"} 2' in text
    assert 'ringlog_request_latency_us_count{core="0"} 1' in text
    assert "# TYPE ringlog_request_latency_us histogram" in text


def test_a_request_costs_about_a_microsecond() -> None:
    mt = CoreMetrics(0)
    n = 50_000
    t0 = time.perf_counter()
    for _ in range(n):
        mt.reply(100, mt.request(4, 100))
    per_request_us = (time.perf_counter() - t0) / n * 1e6
    assert per_request_us < 10, f"{per_request_us:.2f} us per request for metrics"  # ~1 us measured


def test_the_http_endpoint_serves_every_core_and_the_ebpf_counters(tmp_path: Path) -> None:
    mt = CoreMetrics(1)
    mt.reply(10, mt.request(ApiKey.FETCH, 20))
    publish(str(tmp_path), mt.snapshot({}))
    doc = {"steering": True, "steer": {"payload": 3}, "xdp": {"iface": "lo", "classes": {"pass": 9}}}
    (tmp_path / "run" / "bpf.json").write_text(json.dumps(doc))
    server = serve_metrics("127.0.0.1", 0, str(tmp_path), 2)
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
            assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            text = r.read().decode()
        assert 'ringlog_requests_total{core="1",api="FETCH"} 1' in text
        assert "ringlog_bpf_steering 1" in text
        assert 'ringlog_bpf_steered_total{rule="payload"} 3' in text
        assert 'ringlog_xdp_packets_total{iface="lo",class="pass"} 9' in text
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"{url}/other", timeout=10)
        assert err.value.code == 404
    finally:
        server.shutdown()
        server.server_close()


def test_no_ebpf_snapshot_adds_no_series() -> None:
    assert bpf_prometheus_text(None) == ""
    assert bpf_prometheus_text({"steering": False}).splitlines()[-1] == "ringlog_bpf_steering 0"


def test_the_halves_of_a_replication_round_trip_have_histograms_and_totals() -> None:
    mt = CoreMetrics(core=0)
    mt.replica_acked(time.monotonic_ns() - 1_500_000)  # 1.5 ms: bit length 11
    mt.replica_appended(time.monotonic_ns() - 100_000)  # 100 us: bit length 7
    mt.replica_appended(time.monotonic_ns() - 100_000)
    snap = mt.snapshot()
    assert snap["replica_ack_us_log2"][11] == 1 and sum(snap["replica_ack_us_log2"]) == 1
    assert 1500 <= snap["replica_ack_us_total"] < 1600
    assert snap["replica_append_us_log2"][7] == 2 and sum(snap["replica_append_us_log2"]) == 2
    assert 200 <= snap["replica_append_us_total"] < 300
    assert sum(snap["latency_us_log2"]) == 0 and sum(snap["replica_fetch_us_log2"]) == 0
