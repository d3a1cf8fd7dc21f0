"""The `[ray]` section: the endpoint as a Ray Serve application of N replicas (liveloop/serve_ray.py).

    [ray]
    enabled = true          # `liveloop serve` runs the endpoint on Ray Serve (liveloop/serve_ray.py)
    address = ""            # "": a private local Ray (loopback, token auth); else a cluster to join ("auto", "host:port")
    num_cpus = 2            # the private Ray's CPUs (the learner actor takes 1)
    replicas = 2            # Serve replicas, each with its own engine, writer and version watcher
    replica_cpus = 0.5      # each replica's share of a CPU: 2 x 0.5 + the learner's 1 fit on 2 CPUs
    http_host = ""          # Serve's HTTP proxy ("": [server] host)
    http_port = 0           # (0: [server] port)
    max_ongoing_requests = 0  # requests Serve sends one replica at once (0: [server] max_concurrent_total)
    max_queued_requests = 0   # requests Serve's proxy holds waiting for a replica (0: [server] max_concurrent_total)

Serve's proxy never queues without bound: past `max_queued_requests` requests waiting for a replica
(every replica at its `max_ongoing_requests`), it answers 503 at once with `Retry-After: [server]
retry_after_seconds`, and the request reaches no replica (nothing is logged of it).

The replica registry and fleet leadership are every serving process's, Serve replica or plain
`liveloop serve`: their keys (`replica_id`, `heartbeat_seconds`, `down_after_seconds`,
`leader_lease_seconds`) moved to `[server]` (liveloop/config.py `MOVED`; store/replicas.py,
server/control/leader.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class RayConfig:
    enabled: bool = field(default=False, metadata={"help": "serve the endpoint as a Ray Serve application (N replicas, one learner)"})
    address: str = field(
        default="", metadata={"help": "\"\": start a private local Ray (loopback only, token auth); else the address of a Ray cluster to join"}
    )
    num_cpus: int = field(default=2, metadata={"help": "the private local Ray's CPUs (the learner actor takes 1)"})
    replicas: int = field(default=2, metadata={"help": "Serve replicas of the endpoint, each with its own engine"})
    replica_cpus: float = field(default=0.5, metadata={"help": "CPUs Ray reserves per replica (fractional: several share a core)"})
    max_ongoing_requests: int = field(
        default=0, metadata={"help": "requests Serve sends one replica at once (0: [server] max_concurrent_total; admission answers 429 beyond)"}
    )
    max_queued_requests: int = field(
        default=0,
        metadata={"help": "requests Serve's proxy holds while every replica is at max_ongoing_requests (0: [server] "
                  "max_concurrent_total); beyond, 503 with Retry-After at once, never an unbounded queue"},
    )
    http_host: str = field(default="", metadata={"help": "where Serve's HTTP proxy listens (\"\": [server] host)"})
    http_port: int = field(default=0, metadata={"help": "Serve's HTTP port (0: [server] port)"})

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"replicas: must be at least 1, got {self.replicas}")
        if self.num_cpus < 1:
            raise ValueError(f"num_cpus: must be at least 1, got {self.num_cpus}")
        if not 0 < self.replica_cpus <= 64:
            raise ValueError(f"replica_cpus: must be in (0, 64], got {self.replica_cpus}")
        if self.max_ongoing_requests < 0:
            raise ValueError(f"max_ongoing_requests: must be >= 0, got {self.max_ongoing_requests}")
        if self.max_queued_requests < 0:
            raise ValueError(f"max_queued_requests: must be >= 0 (0: [server] max_concurrent_total), got {self.max_queued_requests}")
        if not 0 <= self.http_port < 65536:
            raise ValueError(f"http_port: {self.http_port} is not a port")
