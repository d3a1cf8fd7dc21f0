"""The operator's commands: `liveloop versions`, `liveloop rollback V`, `liveloop learning pause|resume`,
`liveloop adapters`, `liveloop evaluation V` (through a running server's admin API, with an admin key)
and `liveloop report drift` (from the store, no server needed).

With per-segment adapters (`[segments] adapters`), `--segment NAME` narrows `versions` to one lineage
(`base`: the base weights'), and moves only that segment's lineage for `rollback` and `learning`."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from typing import Any

from liveloop.cli_options import config_option


def _admin_client(args: argparse.Namespace):
    from liveloop.clients import LiveloopClient
    from liveloop.config import load_config

    key = args.api_key or os.environ.get("LIVELOOP_ADMIN_KEY")
    if not key:
        key = (load_config(args.config).auth.dev_admin_keys or ("",))[0]
    return LiveloopClient(args.base_url, key)


def _call(args: argparse.Namespace, fn) -> Any:
    from liveloop.clients.client import LiveloopError

    try:
        with _admin_client(args) as client:
            return fn(client)
    except LiveloopError as exc:
        print(f"liveloop: {exc}", file=sys.stderr)
        raise SystemExit(1) from None


def _pct(x: float | None) -> str:
    return "   –  " if x is None else f"{100 * x:5.1f}%"


def _versions(client, segment: str | None = None) -> dict[str, Any]:
    """The admin view (with reward); a user key gets the public list (no reward figures)."""
    from liveloop.clients.client import LiveloopError

    try:
        return client.admin_versions(segment)
    except LiveloopError as exc:
        if exc.status != 403:
            raise
    body = client.versions()
    empty = {"n": 0, "positive": 0, "rate": None, "low": 0.0, "high": 1.0}
    if segment is not None:  # the public list has every lineage: keep the one asked for
        body["data"] = [v for v in body["data"] if _lineage(v) == segment]
    for v in body["data"]:
        serving = v["version"] == body["serving"] if v.get("segment") is None else v["status"] == "serving"
        v.update(serving=serving, responses=0, reward=empty, vs_parent=None)
    return body


def _lineage(v: dict[str, Any]) -> str:
    return v.get("segment") or "base"


def cmd_versions(args: argparse.Namespace) -> int:
    body = _call(args, lambda c: _versions(c, args.segment))
    if args.json:
        print(json.dumps(body, indent=2))
        return 0
    # the segment column only where there are adapters (or one was asked for)
    segments = args.segment is not None or any(v.get("segment") for v in body["data"])
    seg_head = f" {'segment':<10}" if segments else ""
    print(f"{'version':>8} {'parent':>7}{seg_head} {'status':<12} {'responses':>9} {'ratings':>8} {'reward':>7} {'95% CI':>17} {'vs parent':>18}")
    for v in body["data"]:
        r, cmp = v["reward"], v["vs_parent"]
        ci = f"[{_pct(r['low'])},{_pct(r['high'])}]" if r["n"] else ""
        vs = f"{100 * cmp['difference']:+.1f} pts p={cmp['p_two_sided']:.3f}" if cmp else ""
        mark = " *" if v["serving"] else ""
        parent = "" if v["parent"] is None else f"v{v['parent']}"
        seg = f" {_lineage(v):<10}" if segments else ""
        print(f"{'v' + str(v['version']) + mark:>8} {parent:>7}{seg} {v['status']:<12} {v['responses']:>9} {r['n']:>8} {_pct(r['rate']):>7} {ci:>17} {vs:>18}")
    return 0


def cmd_rollback(args: argparse.Namespace) -> int:
    done = _call(args, lambda c: c.rollback(args.version, args.reason, args.segment, args.if_serving))
    rolled = ", ".join(f"v{v}" for v in done["rolled_back"]) or "none"
    who = f"segment {done['segment']}: " if done.get("segment") else ""
    print(f"{who}serving v{done['version']} (was v{done['previous']}); rolled back: {rolled}; swap {done['swap_ms']:.0f} ms")
    return 0


def cmd_forget(args: argparse.Namespace) -> int:
    done = _call(args, lambda c: c.forget_key(args.key_id, args.weights or args.dry_run, args.dry_run))
    if args.json:
        print(json.dumps(done, indent=2))
        return 0
    if "lineages" not in done:
        print(f"key {done['key_id']}: {done['responses_deleted']} responses and {done['ratings_deleted']} ratings deleted (weights kept)")
        return 0
    verb = "would" if done["dry_run"] else "did"
    print(f"key {done['key_id']}: {done['responses']} responses, {done['ratings']} ratings; {done['replay']} ratings of others to train again"
          + (f" (about {done['estimate_seconds']:.0f} s)" if done["estimate_seconds"] is not None else ""))
    for p in done["lineages"]:
        name = p["lane"]
        if p["target"] is None:
            print(f"  {name}: never trained on the key; nothing to roll back")
            continue
        affected = ", ".join(f"v{v}" for v in p["affected"]) or "none"
        why = " (no version trained the key; the learner may hold it unpublished)" if p.get("in_memory") else ""
        print(f"  {name}: {verb} roll back to v{p['target']} (rated after #{p['target_cursor']} retrained){why}; versions {affected}; {p['replay']} ratings")
    return 0


def cmd_learning(args: argparse.Namespace) -> int:
    done = _call(args, lambda c: c.set_learning(args.action == "pause", args.reason, args.segment))
    state = "paused" if done["paused"] else "running"
    print(f"learner {done['learner']}: {state}" + ("" if done["changed"] else " (no change)"))
    return 0


def cmd_adapters(args: argparse.Namespace) -> int:
    body = _call(args, lambda c: c.adapters())
    if args.json:
        print(json.dumps(body, indent=2))
        return 0
    if body["adapters"] == "none":
        print(f"no per-segment adapters ([segments] adapters = \"none\"): every request is served by v{body['base_version']}")
        return 0
    print(f"adapters: {body['adapters']}; base weights v{body['base_version']}")
    print(f"{'segment':<12} {'serving':>8} {'paused':<6} {'versions':>8} {'latest':>7} {'status':<12} {'ratings':>8} {'reward':>7} {'95% CI':>17}")
    for s in body["segments"]:
        serving = "base" if s["serving"] is None else f"v{s['serving']}"
        latest = s["latest"]
        if latest is None:
            tail = f"{'':>7} {'':<12} {'':>8} {'':>7} {'':>17}"
        else:
            r = latest["reward"]
            ci = f"[{_pct(r['low'])},{_pct(r['high'])}]" if r["n"] else ""
            tail = f"{'v' + str(latest['version']):>7} {latest['status']:<12} {r['n']:>8} {_pct(r['rate']):>7} {ci:>17}"
        print(f"{s['segment']:<12} {serving:>8} {'yes' if s['paused'] else 'no':<6} {s['versions']:>8} {tail}")
    return 0


def _num(x: float | None) -> str:
    return "–" if x is None else f"{x:.4g}"


def cmd_evaluation(args: argparse.Namespace) -> int:
    body = _call(args, lambda c: c.evaluation(args.version))
    if args.json:
        print(json.dumps(body, indent=2))
        return 0
    live = "no live version" if body["live_version"] is None else f"against live v{body['live_version']}"
    verdict = "passed" if body["passed"] else "FAILED: " + ", ".join(body["failed"])
    print(f"v{body['version']} {live}: {verdict} ({body['seconds']:.1f} s, {body['engine_seconds']:.1f} s on the engines)")
    print(f"{'check':<24} {'value':>9} {'live':>9} {'base':>9}  {'ok':<4} bound")
    for c in body["checks"]:
        ok = "yes" if c["passed"] else "NO"
        print(f"{c['name']:<24} {_num(c['value']):>9} {_num(c['live']):>9} {_num(c['base']):>9}  {ok:<4} {c['bound'] or ''}")
    return 0


def cmd_report_drift(args: argparse.Namespace) -> int:
    from liveloop.config import load_config
    from liveloop.monitor.report import collect, parse_since, render_html, render_png
    from liveloop.store import Store

    out = str(args.out)
    if not out.endswith((".png", ".html")):
        raise ValueError(f"--out: write a .png or .html file, got {out!r}")
    config = load_config(args.config)
    since = parse_since(args.since)
    store = Store(dataclasses.replace(config.store, url=args.url) if args.url else config.store)
    try:
        store.require_schema()
        data = collect(store, config.monitor, since)
    finally:
        store.close()
    (render_png if out.endswith(".png") else render_html)(data, out)
    print(f"wrote {out}: {sum(b.reward.n for b in data.series)} ratings, {len(data.versions)} versions, {len(data.alarms)} alarms")
    return 0


def _server_args(p: argparse.ArgumentParser) -> None:
    config_option(p)
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="the liveloop server (default: %(default)s)")
    p.add_argument("--api-key", help="admin key (default: $LIVELOOP_ADMIN_KEY, else the config's first dev admin key)")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("versions", help="list policy versions with lineage, status and reward (reward: admin key)")
    _server_args(p)
    p.add_argument("--json", action="store_true", help="print the API's JSON")
    p.add_argument("--segment", help="one lineage only: that adapter segment's versions, or `base` for the base weights'")
    p.set_defaults(func=cmd_versions)

    p = sub.add_parser("rollback", help="serve a stored version again; later versions are marked rolled back (admin)")
    _server_args(p)
    p.add_argument("version", type=int, help="the stored version to serve again")
    p.add_argument("--reason", help="recorded with the rollback (shown in the version's history)")
    p.add_argument("--if-serving", type=int, metavar="V", help="only if version V still serves (what you saw); refused otherwise")
    p.add_argument(
        "--segment",
        help="move this adapter segment's lineage only (version: one of its adapter versions, or the serving base version to serve it no adapter)",
    )
    p.set_defaults(func=cmd_rollback)

    p = sub.add_parser("learning", help="pause or resume the online learner (admin)")
    _server_args(p)
    p.add_argument("action", choices=("pause", "resume"), help="pause: ratings keep arriving, no policy step runs; resume: train again")
    p.add_argument("--reason", help="recorded with the pause or resume")
    p.add_argument("--segment", help="only this adapter segment's lane (it neither trains nor activates; the others go on)")
    p.set_defaults(func=cmd_learning)

    p = sub.add_parser("forget", help="delete a key's responses and ratings; --weights: also retrain without them (admin)")
    _server_args(p)
    p.add_argument("key_id", help="the key's 16 hex digits (as `GET /admin/keys` lists it)")
    p.add_argument("--weights", action="store_true", help="roll its lineages back to before its first trained rating and retrain the others' ratings")
    p.add_argument("--dry-run", action="store_true", help="with --weights (implied): only print what it would do")
    p.add_argument("--json", action="store_true", help="print the API's JSON")
    p.set_defaults(func=cmd_forget)

    p = sub.add_parser("adapters", help="per-segment adapters: serving version, pause switch, latest version's reward (admin)")
    _server_args(p)
    p.add_argument("--json", action="store_true", help="print the API's JSON")
    p.set_defaults(func=cmd_adapters)

    p = sub.add_parser("evaluation", help="a version's evaluation by the release gate: each check against the live and base values (admin)")
    _server_args(p)
    p.add_argument("version", type=int, help="the evaluated version")
    p.add_argument("--json", action="store_true", help="print the API's JSON")
    p.set_defaults(func=cmd_evaluation)

    report = sub.add_parser("report", help="reports from the store").add_subparsers(dest="report_cmd", required=True)
    p = report.add_parser("drift", help="reward over time, versions and drift alarms as a PNG or HTML file")
    p.add_argument("--since", help="e.g. 2h, 30m, 1d, or an ISO time (default: everything)")
    p.add_argument("--out", required=True, help="report.png or report.html")
    config_option(p)
    p.add_argument("--url", help="override store.url")
    p.set_defaults(func=cmd_report_drift)
