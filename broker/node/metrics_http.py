"""The Prometheus endpoint (`serve --metrics-port`): the workers' published metrics, over HTTP.

Rules this module keeps:
- It reads files only: each worker's snapshot under `<data_dir>/run/` (broker/core/metrics.py) and
  the supervisor's eBPF snapshot `run/bpf.json` (bpf/state.py), at each scrape. It never asks a
  worker anything, so a scrape costs the workers nothing and a dead worker only drops its series
  until its restart publishes again.
- It runs on its own daemon threads (one per scrape), apart from the supervisor's loop, which it
  never touches: the supervisor starts it and calls `shutdown()` on the way out.
- GET `/metrics` (or `/`) answers text format 0.0.4; anything else is a 404. Requests are not
  logged (a scraper every few seconds would fill the broker's log).
"""

from __future__ import annotations

import http.server
import logging
import threading

from bpf import state as bpf_state
from broker.core.metrics import prometheus_text, read_snapshots

log = logging.getLogger("broker.node.supervisor")  # its log line is the supervisor's, as before

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def metrics_text(data_dir: str, cores: int) -> str:
    """What one scrape answers: every core's series, then the eBPF counters if a plane published."""
    return prometheus_text(read_snapshots(data_dir, cores)) + bpf_prometheus_text(bpf_state.read(data_dir))


def bpf_prometheus_text(doc: dict[str, object] | None) -> str:
    """The eBPF counters (bpf.json) in Prometheus text format; empty without a snapshot."""
    if not doc:
        return ""
    lines = [
        "# HELP ringlog_bpf_steering Whether the reuseport program steers the public port.",
        "# TYPE ringlog_bpf_steering gauge",
        f"ringlog_bpf_steering {int(bool(doc.get('steering')))}",
    ]
    steer = doc.get("steer")
    if isinstance(steer, dict):
        lines += [
            "# HELP ringlog_bpf_steered_total New connections by steering rule.",
            "# TYPE ringlog_bpf_steered_total counter",
        ]
        lines += [f'ringlog_bpf_steered_total{{rule="{k}"}} {v}' for k, v in steer.items()]
    xdp = doc.get("xdp")
    if isinstance(xdp, dict) and isinstance(xdp.get("classes"), dict):
        lines += [
            "# HELP ringlog_xdp_packets_total Ingress packets by XDP class.",
            "# TYPE ringlog_xdp_packets_total counter",
        ]
        lines += [
            f'ringlog_xdp_packets_total{{iface="{xdp.get("iface")}",class="{k}"}} {v}'
            for k, v in xdp["classes"].items()
        ]
    return "\n".join(lines) + "\n"


def serve_metrics(host: str, port: int, data_dir: str, cores: int) -> http.server.ThreadingHTTPServer:
    """Listen on host:port (0: ephemeral, see `server_address`) and serve scrapes on a daemon thread
    until `shutdown()`. Raises OSError when the port cannot be bound: a start-up error."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] not in ("/metrics", "/"):
                self.send_error(404)
                return
            body = metrics_text(data_dir, cores).encode()
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True)
    thread.start()
    log.info("metrics on http://%s:%d/metrics", host, server.server_address[1])
    return server
