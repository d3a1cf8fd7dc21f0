"""The server's configuration sections: `[server]` (HTTP), `[auth]` (API keys), `[engine]` (backend)."""

from dataclasses import dataclass, field
from typing import Literal

from liveloop.config_types import check_literals
from liveloop.segments import SEGMENT_KEY
from liveloop.server.engines.registry import HELP, EngineBackend


@dataclass(frozen=True)
class ServerConfig:
    host: str = field(default="127.0.0.1", metadata={"help": "address to listen on"})
    port: int = field(default=8000, metadata={"help": "port to listen on"})
    max_body_bytes: int = field(default=1 << 20, metadata={"help": "larger request bodies get 413"})
    default_max_tokens: int = field(default=128, metadata={"help": "max_tokens when a request gives none"})
    max_tokens_limit: int = field(default=512, metadata={"help": "largest max_tokens a request may ask for"})
    stream_interval_ms: float = field(
        default=20.0,
        metadata={"help": "a stream writes its first token at once, then what arrived since its last write at most "
                  "this often (0: one write per engine delta)"},
    )
    log_level: Literal["critical", "error", "warning", "info", "debug", "trace"] = field(
        default="info", metadata={"help": "uvicorn log level"}
    )
    watch_seconds: float = field(
        default=0.1, metadata={"help": "how often the server looks in the store for versions learners published"}
    )
    chat_requests_per_minute: int = field(
        default=600,
        metadata={"help": "per API key: chat/completion requests per minute, fleet-wide with fleet_limits (429 beyond; "
                  "0 = no limit)"},
    )
    feedback_per_minute: int = field(
        default=1200,
        metadata={"help": "per API key: ratings (and deletes) per minute, fleet-wide with fleet_limits (429 beyond; "
                  "0 = no limit)"},
    )
    stored_reads_per_minute: int = field(
        default=1200,
        metadata={"help": "per API key: reads of its stored responses (GET /v1/chat/completions[/ID[/messages]], "
                  "/v1/responses/ID[/input_items]) per minute, fleet-wide with fleet_limits (429 beyond; 0 = no limit)"},
    )
    grammar_compile_seconds: float = field(
        default=3.0,
        metadata={"help": "a request's constraint (forced tool call, JSON response format) must compile within this, in "
                  "a child process killed past it (400 grammar_too_complex): a schema that takes minutes to compile "
                  "holds the prompt thread every request is prepared on for at most this long"},
    )
    stored_mb_per_day: float = field(
        default=1024.0,
        metadata={"help": "per API key: megabytes of responses (token arrays, conversation JSON, grammar) it may have "
                  "stored per UTC day, fleet-wide (the store counts them); past it its generating requests that "
                  "store get 429 until the day ends (0 = no limit). With [store] retain_days R a key holds at most "
                  "R times this"},
    )
    max_concurrent_per_key: int = field(
        default=16,
        metadata={"help": "generations one API key may run at once on each replica (its share of that replica's engine, "
                  "as max_concurrent_total is the engine's; across the fleet: max_concurrent_per_key_fleet)"},
    )
    max_concurrent_per_key_fleet: int = field(
        default=0,
        metadata={"help": "generations one API key may run at once across every replica on this store (needs "
                  "fleet_limits; may be passed by what other replicas start within about 2 x limits_sync_seconds); "
                  "0: no fleet-wide cap, each replica's max_concurrent_per_key alone"},
    )
    fleet_limits: bool = field(
        default=True,
        metadata={"help": "the per-key rates, max_concurrent_per_key_fleet and the sign-in throttle count every replica "
                  "on this store: each replica counts in memory and syncs through the store every limits_sync_seconds, "
                  "refusing once the fleet's known count reaches a limit (beyond it at most what the other replicas "
                  "admit in about 2 x limits_sync_seconds); false: each replica counts alone (N replicas, N x each limit)"},
    )
    limits_sync_seconds: float = field(
        default=0.25,
        metadata={"help": "fleet_limits: how often a replica pushes what it admitted to the store and reads the other "
                  "replicas' counts (one small transaction, off the request path); the limits' overshoot grows with it"},
    )
    max_concurrent_total: int = field(
        default=256, metadata={"help": "generations running or waiting for the engine, all keys together"}
    )
    auto_tool_choice: Literal["auto", "required_after_user"] = field(
        default="auto",
        metadata={"help": "what tool_choice auto (or none given, with tools offered) means: auto (the model decides) or "
                  "required_after_user (a reply to a user's turn must call one of the tools, under their grammar; a reply "
                  "to a tool's result decides itself): drives an agent client's tool loop with a model that never calls "
                  "tools on its own (the agents preset's tiny model)"},
    )
    store_false: Literal["nothing", "tokens"] = field(
        default="nothing",
        metadata={"help": "what a request's `store: false` keeps: nothing (no row, no training) or tokens (its tokens, "
                  "logprobs, versions and episode links are logged, rated and trained on like any response's; its "
                  "conversation text is not kept, so no API reads it back). For agent clients that always send "
                  "store: false (Codex CLI), on a server whose users agreed that their sessions train it"},
    )
    max_prompt_chars: int = field(
        default=0,
        metadata={"help": "most characters a chat's messages (or a completion's text prompt) may hold, checked before "
                  "the chat template or the tokenizer runs (400 beyond); 0: 32 per token of engine.max_model_len"},
    )
    header_timeout_seconds: float = field(
        default=10.0,
        metadata={"help": "a connection must send a request's complete headers within this many seconds of opening "
                  "(or of the first byte of a later request on it), else it is closed"},
    )
    trusted_proxies: tuple[str, ...] = field(
        default=(),
        metadata={"help": "addresses of reverse proxies whose X-Forwarded-For / X-Forwarded-Proto headers are believed "
                  "(uvicorn's forwarded_allow_ips); empty: none, every client is who its socket says (a client that sets "
                  "X-Forwarded-For itself cannot pose as another address, e.g. to the sign-in throttle)"},
    )
    max_connections: int = field(
        default=512,
        metadata={"help": "open connections (idle keep-alive ones too) and requests in progress this server takes at once; "
                  "past it each new request is answered 503 at once, before any of liveloop's code runs (uvicorn's "
                  "limit_concurrency). Below the usual 1,024 open files a process may hold, so a client opening "
                  "sockets by the thousand cannot take the descriptors the store and the engine need; 0: no cap"},
    )
    keep_alive_seconds: float = field(
        default=75.0,
        metadata={"help": "an idle keep-alive connection is closed after this many seconds; keep it above every client's "
                  "and proxy's own idle expiry (httpx and the openai/anthropic clients: 5 s), or a client may send a "
                  "request on a connection the server is closing at that instant and see it dropped"},
    )
    body_timeout_seconds: float = field(
        default=30.0,
        metadata={"help": "a request's body must arrive within this many seconds of its headers (408 beyond)"},
    )
    retry_after_seconds: int = field(default=1, metadata={"help": "Retry-After on a 503 when the log queue is full"})
    allow_dev_keys_on_public_bind: bool = field(
        default=False,
        metadata={"help": "let a non-loopback host start with auth.dev_* keys (refused by default: they are public)"},
    )
    max_import_bytes: int = field(
        default=64 << 30,
        metadata={"help": "POST /admin/weights: the most bytes of checkpoint files copied from an operator's directory "
                  "into the learner's checkpoint_dir (400 checkpoint_too_large beyond)"},
    )
    allowed_hosts: tuple[str, ...] = field(
        default=(),
        metadata={"help": "Host headers served (against DNS rebinding): `name` (any port) or `name:port`, `*.domain`, "
                  "or `*` (any); others get 400. Empty: 127.0.0.1, localhost, [::1] and `host`, each on `port`"},
    )
    ops_open_on_loopback: bool = field(
        default=False,
        metadata={"help": "serve /metrics and /healthz's details to clients on loopback without the admin key "
                  "(otherwise they need it; /healthz's status is public either way)"},
    )
    login_failures_per_minute: int = field(
        default=5, metadata={"help": "dashboard sign-ins: failed attempts per client address per minute (429 beyond)"}
    )
    login_failures_per_minute_total: int = field(
        default=30, metadata={"help": "dashboard sign-ins: failed attempts per minute, all clients together (429 beyond)"}
    )
    replica_id: str = field(
        default="auto",
        metadata={"help": "this process's name in the fleet's replica registry (auto: a random name per process; a Ray Serve "
                  "replica's is its Serve id); every serving process is a replica, a plain `liveloop serve` a fleet of one"},
    )
    heartbeat_seconds: float = field(
        default=1.0, metadata={"help": "the replica's registry row is rewritten at least this often (at once when what it serves changes)"}
    )
    down_after_seconds: float = field(default=5.0, metadata={"help": "a replica whose heartbeat is older than this is shown down"})
    leader_lease_seconds: float = field(
        default=10.0,
        metadata={"help": "the fleet's leader lease (server/control/leader.py): renewed every third of it; a leader killed is "
                  "replaced within about 1.3x it"},
    )
    segment_key: str = field(
        default=SEGMENT_KEY,
        metadata={"help": "the request metadata key that names a request's segment, whose adapter serves it ([learner] "
                  "adapters and segments: the segments the learner trains; moved here from [learner])"},
    )

    def __post_init__(self) -> None:
        check_literals(self)
        if not 0 < self.port < 65536:
            raise ValueError("port must be in 1..65535")
        if self.watch_seconds <= 0:
            raise ValueError("watch_seconds must be > 0")
        if not 0 <= self.stream_interval_ms <= 1000:
            raise ValueError("stream_interval_ms must be in 0..1000")
        if min(self.chat_requests_per_minute, self.feedback_per_minute, self.stored_reads_per_minute, self.stored_mb_per_day) < 0:
            raise ValueError("chat_requests_per_minute, feedback_per_minute, stored_reads_per_minute and stored_mb_per_day "
                             "must be >= 0 (0 = no limit)")
        if self.max_concurrent_per_key < 1 or self.max_concurrent_total < 1 or self.retry_after_seconds < 1:
            raise ValueError("max_concurrent_per_key, max_concurrent_total and retry_after_seconds must be >= 1")
        if self.max_prompt_chars < 0:
            raise ValueError("max_prompt_chars must be >= 0 (0: derived from engine.max_model_len)")
        if self.grammar_compile_seconds <= 0:
            raise ValueError("grammar_compile_seconds must be > 0")
        if self.header_timeout_seconds <= 0 or self.body_timeout_seconds <= 0 or self.keep_alive_seconds <= 0:
            raise ValueError("header_timeout_seconds, body_timeout_seconds and keep_alive_seconds must be > 0")
        if self.max_connections < 0:
            raise ValueError("max_connections must be >= 0 (0: no cap)")
        if self.max_import_bytes < 1:
            raise ValueError("max_import_bytes must be >= 1")
        if self.default_max_tokens < 1 or self.max_tokens_limit < 1:
            raise ValueError("default_max_tokens and max_tokens_limit must be >= 1")
        if not self.replica_id or len(self.replica_id) > 128:
            raise ValueError("replica_id: 1 to 128 characters")
        if self.heartbeat_seconds <= 0 or self.down_after_seconds <= self.heartbeat_seconds:
            raise ValueError("heartbeat_seconds must be > 0 and down_after_seconds larger than it")
        if not 0.3 <= self.leader_lease_seconds <= 3600:
            raise ValueError(f"leader_lease_seconds: must be in [0.3, 3600], got {self.leader_lease_seconds}")
        if self.login_failures_per_minute < 1 or self.login_failures_per_minute_total < 1:
            raise ValueError("login_failures_per_minute and login_failures_per_minute_total must be >= 1")
        if not 0 < self.limits_sync_seconds <= 5:
            raise ValueError(f"limits_sync_seconds must be in (0, 5] (a fleet-wide limit is passed by what the other "
                             f"replicas admit in about two syncs), got {self.limits_sync_seconds}")
        if self.max_concurrent_per_key_fleet < 0:
            raise ValueError("max_concurrent_per_key_fleet must be >= 0 (0: no fleet-wide cap)")
        if self.max_concurrent_per_key_fleet and not self.fleet_limits:
            raise ValueError("max_concurrent_per_key_fleet needs fleet_limits = true (the replicas share their counts "
                             "through the store); set it to 0 or turn fleet_limits on")
        for entry in self.allowed_hosts:
            if not entry or any(c in entry for c in "/ @"):
                raise ValueError(f"allowed_hosts: {entry!r} is not a host name, `name:port`, `*.domain` or `*`")


@dataclass(frozen=True)
class AuthConfig:
    """API keys. Production: keys from environment variables (comma-separated) or as sha256 hex hashes.
    The `dev_*` lists hold plain-text keys and are for development only."""

    dev_user_keys: tuple[str, ...] = field(default=(), metadata={"help": "DEVELOPMENT ONLY: plain-text user keys"})
    dev_admin_keys: tuple[str, ...] = field(default=(), metadata={"help": "DEVELOPMENT ONLY: plain-text admin keys"})
    user_keys_env: str = field(default="LIVELOOP_USER_KEYS", metadata={"help": "env var with user keys"})
    admin_keys_env: str = field(default="LIVELOOP_ADMIN_KEYS", metadata={"help": "env var with admin keys"})
    user_key_sha256: tuple[str, ...] = field(default=(), metadata={"help": "sha256 hex digests of user keys"})
    admin_key_sha256: tuple[str, ...] = field(default=(), metadata={"help": "sha256 hex digests of admin keys"})
    forgotten_keys: Literal["refuse", "unstored"] = field(
        default="refuse",
        metadata={"help": "what a key an operator forgot gets: refuse (403 to everything) or unstored (served, "
                  "nothing of it stored or trained)"},
    )

    def __post_init__(self) -> None:
        check_literals(self)


@dataclass(frozen=True)
class EngineConfig:
    backend: EngineBackend = field(default="vllm", metadata={"help": HELP})  # the backends: server/engines/registry.py
    model: str = field(
        default="models/liveloop-tiny",
        metadata={"help": "a Hugging Face checkpoint directory; the tiny default is built there when missing"},
    )
    served_model_name: str = field(default="liveloop-tiny", metadata={"help": "the `model` clients ask for"})
    dtype: Literal["float32", "bfloat16", "float16"] = field(
        default="float32", metadata={"help": "float32 | bfloat16 | float16"}
    )
    device: Literal["cpu", "cuda", "auto"] = field(
        default="cpu", metadata={"help": "hf engine: where the model runs (auto: cuda when present, else cpu)"}
    )
    max_model_len: int = field(default=512, metadata={"help": "context length: prompt + completion tokens"})
    seed: int = field(default=0, metadata={"help": "engine seed (requests without a seed draw from it)"})
    max_num_seqs: int = field(default=32, metadata={"help": "most requests generating at once"})
    gpu_memory_utilization: float = field(default=0.3, metadata={"help": "vLLM memory share"})
    cpu_kv_cache_gb: float = field(
        default=1.0,
        metadata={"help": "vLLM-CPU KV cache in GiB (fractions allowed); it must hold one max_model_len context. "
                  "VLLM_CPU_KVCACHE_SPACE, when set, overrides it in whole GiB"},
    )
    prefix_caching: bool = field(
        default=False,
        metadata={"help": "vllm: reuse the KV of a prompt prefix an earlier request computed (an agent's later turns "
                  "prefill only their new tokens); every weight swap empties the cache, in either swap_mode"},
    )
    checkpoint_dir: str = field(
        default="data/checkpoints", metadata={"help": "where tensors pushed to update_weights are written"}
    )
    drain_deadline_seconds: float = field(
        default=30.0,
        metadata={
            "help": "a swap waits this long for in-flight generations; then the stragglers are ended "
            "(finish_reason 'abort', every token logged under the version that produced it) and the swap proceeds"
        },
    )
    swap_mode: Literal["drain", "keep"] = field(
        default="drain",
        metadata={
            "help": "drain: a swap waits for running generations (each response comes from one version); keep: "
            "running generations continue under the new weights at the next token, their KV recomputed, and "
            "each response records which version sampled which tokens (version spans)"
        },
    )
    # "reload" stays as the baseline arm of bench/feedback_to_live.py (default_before) and bench/swap_pause.py
    # --loads, whose results docs/results records (the reload code runs anyway where staging does not apply);
    # the value goes 2027-03-31, once those arms are re-measured without it
    vllm_weight_load: Literal["staged", "reload"] = field(
        default="staged",
        metadata={
            "help": "vllm: how a swap's weights enter the running engine. staged: loaded and processed beside the "
            "serving model while it keeps generating, then copied in during a pause of about a millisecond "
            "(CPU; elsewhere, or for a layer kind staging does not know, it reloads); reload: vLLM's in-place "
            "reload_weights inside the pause (the path before, 50-125 ms at the tiny model on two busy cores)"
        },
    )
    # "thread" stays as the baseline arm of bench/serving_overhead.py and bench/feedback_to_live.py
    # (default_thread), whose results docs/results/serving.md records (the process's child runs the same
    # thread engine anyway); the value goes 2027-03-31, once those arms are re-measured without it
    hf_worker: Literal["thread", "process"] = field(
        default="process",
        metadata={
            "help": "hf: where the model runs. thread: a thread of the server's process; process: a process of its "
            "own (the engine's steps then never wait for the server's Python; docs/results/serving.md)"
        },
    )
    delta_interval_ms: float = field(
        default=10.0,
        metadata={
            "help": "hf: a running generation's tokens reach the server in one piece at most this often (its first "
            "and last token at once); 0: every token as it is sampled"
        },
    )
    trust_remote_code: bool = field(
        default=False,
        metadata={
            "help": "run the model code a checkpoint brings (e.g. LLaDA, Dream); only for checkpoints you trust"
        },
    )
    diffusion_block_length: int | None = field(
        default=None,
        metadata={
            "help": "diffusion: positions decoded (and streamed) per block; unset: the model's build record, else 8"
        },
    )
    diffusion_steps_per_block: int | None = field(
        default=None,
        metadata={"help": "diffusion: denoising steps per block; unset: the model's build record, else 8"},
    )

    tool_call_parser: Literal["auto", "hermes", "llama3_json", "none"] = field(
        default="auto",
        metadata={"help": "how tool calls are written by this model family (server/edge/formats/tool_parsers/): hermes (Hermes, "
                  "Qwen2.5/3, liveloop-tiny), llama3_json (Llama 3.1/3.2); auto: read from the chat template; none: "
                  "requests with tools are refused"},
    )
    json_max_string: int = field(
        default=0,
        metadata={"help": "constrained decoding (forced tool calls, response_format): a JSON string whose schema sets no "
                  "length bound (maxLength, enum, const, pattern, format) holds at most this many characters, and an "
                  "unbounded integer stays within +-(2^53 - 1); 0: as the schema says (a small model may write one string "
                  "until max_tokens, and the call never closes)"},
    )
    constrained_json: Literal["canonical", "compact", "free"] = field(
        default="canonical",
        metadata={"help": "how constrained decoding (forced tool calls, response_format) lays out JSON: canonical (', ' "
                  "and ': ' between tokens, nothing else: what json.dumps and chat templates write, so a call sent back "
                  "renders as it was sampled), compact (no whitespace), free (any whitespace: a small model may pad "
                  "without end)"},
    )
    max_adapters: int = field(
        default=0,
        metadata={
            "help": "LoRA adapters the engine can hold at once (segments' adapters, plus old ones still "
            "finishing a response); 0: no adapter support"
        },
    )
    max_lora_rank: int = field(default=16, metadata={"help": "the largest LoRA rank an adapter may have"})
    sglang_url: str = field(
        default="http://127.0.0.1:30000",
        metadata={"help": "sglang: the SGLang server's base URL (on this machine: it reads the checkpoint directories "
                  "liveloop names)"},
    )
    sglang_api_key_env: str = field(
        default="SGLANG_API_KEY",
        metadata={"help": "sglang: the environment variable holding the key SGLang was started with (`--api-key`), sent "
                  "as a bearer token on every call; unset or empty: none is sent. The key itself is never in a config file"},
    )
    sglang_timeout_seconds: float = field(
        default=300.0,
        metadata={"help": "sglang: the longest wait for an answer from SGLang (a weight update, a health check, the "
                  "next chunk of a stream)"},
    )
    sglang_health_seconds: float = field(
        default=5.0, metadata={"help": "sglang: how often GET /health is asked (healthy() reads the last answer)"}
    )

    def __post_init__(self) -> None:
        check_literals(self)
        if self.max_adapters < 0 or self.max_lora_rank < 1:
            raise ValueError("max_adapters must be >= 0 and max_lora_rank >= 1")
        if self.max_model_len < 16:
            raise ValueError("max_model_len must be >= 16")
        if self.json_max_string < 0:
            raise ValueError("json_max_string must be >= 0 (0: no bound)")
        if self.cpu_kv_cache_gb <= 0:
            raise ValueError("cpu_kv_cache_gb must be > 0")
        if self.drain_deadline_seconds <= 0:
            raise ValueError("drain_deadline_seconds must be > 0")
        if not 0 <= self.delta_interval_ms <= 1000:
            raise ValueError("delta_interval_ms must be in 0..1000")
        if not self.sglang_url.startswith(("http://", "https://")):
            raise ValueError(f"sglang_url must be an http:// or https:// URL, got {self.sglang_url!r}")
        if self.sglang_timeout_seconds <= 0 or self.sglang_health_seconds <= 0:
            raise ValueError("sglang_timeout_seconds and sglang_health_seconds must be > 0")
        for name in ("diffusion_block_length", "diffusion_steps_per_block"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
