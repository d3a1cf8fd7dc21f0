"""The BGPO batch job: offline RL of a masked diffusion LM from the store's rated responses and/or task
problems, publishing each new policy version to the store. (`loss = vrpo_ol | diffu_grpo` run the
baselines through the same loop, for comparisons: `objectives.py` maps the name to what differs.)

One step:
    1. groups: rated responses of the diffusion model past the job's cursor, then task problems;
    2. rollouts: each group topped up to G responses by the current policy (the old policy of this step);
    3. rewards -> group advantages A = (r - mean) / std (the RL core's group normalisation);
    4. n_t masks drawn ONCE per response; the objective's old-policy terms (l_old) under no_grad;
    5. `inner_updates` optimizer steps; BGPO back-propagates one Monte-Carlo sample's graph at a time
       (constant memory in n_t);
    6. rollouts written to the store (`responses`, ids deterministic per step: a redone step skips them);
    7. every `publish_every` steps: checkpoint directory (model, tokenizer, trainer state) written
       atomically under a staging name, then the version row and the cursor in one transaction, which
       allocates the version number and moves the checkpoint to out_dir/vNNNNN (its name is its number).
A killed job restarts from its newest checkpoint (one the store lacks is published first, under the
number the store gives it); each step's prompts, rollouts and masks come from a
seed derived from (seed, step), so a redone step repeats itself.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from liveloop.checkpoint import checkpoint_digest, save_atomically
from liveloop.diffusion.config import BGPOJobConfig
from liveloop.diffusion.elbo import draw_masks
from liveloop.diffusion.groups import Group, fill_with_rollouts, served_form, store_groups, task_groups
from liveloop.diffusion.model import MaskedDiffusionLM, load_diffusion_model
from liveloop.diffusion.objectives import Objective, Prepared, make_objective
from liveloop.diffusion.sft import ensure_diffusion_model
from liveloop.rl.advantages import group_normalized_advantages
from liveloop.store.records import ResponseRecord, VersionRecord
from liveloop.store.store import Store

STATE_FILE = "trainer_state.pt"
_CKPT_RE = re.compile(r"^v(\d+)$")


@dataclass
class TrainerState:
    step: int  # steps done
    version: int  # version of the current weights in the store (a checkpoint's is its directory's name)
    cursor: int  # last feedback id consumed
    rewards_since_publish: list[float]


def run_bgpo(job: BGPOJobConfig, progress: bool = True, max_steps: int | None = None,
             max_seconds: float | None = None) -> dict[str, Any]:
    """Run (or resume) the job. `max_steps` stops after that many steps in this call without publishing
    (tests of resuming); `max_seconds` stops once that wall time is spent and publishes what was done
    (benchmarks with equal budgets)."""
    deadline = None if max_seconds is None else time.monotonic() + max_seconds
    torch.set_num_threads(1)
    cfg = job.bgpo
    objective = make_objective(cfg)
    out_dir = Path(cfg.out_dir)
    store = Store(job.store)
    if job.store.auto_migrate:
        store.migrate()
    try:
        # 1. Policy, optimizer and state: from the newest checkpoint, else the starting model.
        resume_dir = latest_checkpoint(out_dir)
        model, tokenizer, optimizer, state = _load(job, store, resume_dir)
        _ensure_published(store, resume_dir, state, cfg.run_name)
        encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
        decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=False)  # noqa: E731
        bar = tqdm(total=cfg.steps, initial=state.step, desc=f"{cfg.loss} {cfg.run_name}", disable=not progress)
        done_here, metrics = 0, {}
        while state.step < cfg.steps and (max_steps is None or done_here < max_steps):
            metrics = _step(job, objective, store, model, optimizer, state, encode, decode)
            state.step += 1
            done_here += 1
            out_of_time = deadline is not None and time.monotonic() >= deadline
            if state.step % cfg.publish_every == 0 or state.step == cfg.steps or out_of_time:
                _publish(job, store, model, tokenizer, optimizer, state, metrics)
            if out_of_time:
                break
            bar.update(1)
            bar.set_postfix(reward=f"{metrics['bgpo/reward_mean']:.3f}", v=state.version)
        bar.close()
        return {"step": state.step, "version": state.version, **metrics}
    finally:
        store.close()


def latest_checkpoint(out_dir: Path) -> Path | None:
    found = [(int(m.group(1)), p) for p in out_dir.glob("v*") if (m := _CKPT_RE.match(p.name))
             and (p / STATE_FILE).is_file()]
    return max(found)[1] if found else None


def _load(job: BGPOJobConfig, store: Store, resume_dir: Path | None):
    cfg = job.bgpo
    if resume_dir is not None:
        model, tokenizer = load_diffusion_model(resume_dir, cfg.trust_remote_code)
        saved = torch.load(resume_dir / STATE_FILE, weights_only=False)
        state = TrainerState(**{**saved["state"], "version": _checkpoint_version(resume_dir)})
    else:
        if Path(cfg.model_dir).resolve() == Path(job.build.out_dir).resolve():
            ensure_diffusion_model(job.build, cfg.model_dir)
        model, tokenizer = load_diffusion_model(cfg.model_dir, cfg.trust_remote_code)
        saved = None
        state = TrainerState(0, _starting_version(store, cfg), store.feedback.get_cursor(cfg.run_name), [])
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.learning_rate, betas=(0.9, 0.99), weight_decay=0.0)
    if saved is not None:
        optimizer.load_state_dict(saved["optimizer"])
    return model, tokenizer, optimizer, state


def _starting_version(store: Store, cfg) -> int:
    if cfg.parent_version >= 0:
        if store.versions.get_version(cfg.parent_version) is None:
            raise ValueError(f"bgpo.parent_version: version {cfg.parent_version} is not in the store")
        return cfg.parent_version
    if store.versions.get_version(0) is None and not store.versions.list_versions():
        return store.versions.ensure_base_version(str(Path(cfg.model_dir).resolve()), note="diffusion base model").version
    return max(v.version for v in store.versions.list_versions())


def _checkpoint_version(path: Path) -> int:
    return int(_CKPT_RE.match(path.name).group(1))


def _place(staged: Path, version: int) -> str:
    """Inside the store's inserting transaction, with `version` allocated: the staged checkpoint becomes
    out_dir/vNNNNN (a directory left there by a publish that never committed is replaced: no committed
    version has this number). Returns its path for the row."""
    final = staged.parent / f"v{version:05d}"
    if final != staged:
        if final.exists():
            shutil.rmtree(final)
        os.replace(staged, final)
    return str(final.resolve())


def _record(store: Store, staged: Path, cursor_name: str, cursor: int, meta: dict[str, Any]) -> VersionRecord:
    """The version row and the cursor in one transaction that allocates the number and places `staged`
    under it; on failure the checkpoint stays where it is (a staging one is removed)."""
    digest = checkpoint_digest(staged)
    try:
        return store.versions.publish_version(checkpoint_path=lambda v: _place(staged, v), checkpoint_sha256=digest,
                                     cursor_name=cursor_name, last_feedback_id=cursor, **meta)
    except Exception:
        if not _CKPT_RE.match(staged.name):
            shutil.rmtree(staged, ignore_errors=True)
        raise


def _ensure_published(store: Store, resume_dir: Path | None, state: TrainerState, cursor_name: str) -> None:
    """A kill between the checkpoint's move and the commit leaves a checkpoint the store lacks: it is
    published now, under the number the store allocates (and renamed to it, if that differs)."""
    if resume_dir is None:
        return
    row = store.versions.get_version(state.version)
    if row is not None and row.checkpoint_path == str(resume_dir.resolve()):
        return
    meta = json.loads((resume_dir / "publish.json").read_text())
    state.version = _record(store, resume_dir, cursor_name, state.cursor, meta).version


def _step(job: BGPOJobConfig, objective: Objective, store: Store, model: MaskedDiffusionLM, optimizer,
          state: TrainerState, encode, decode) -> dict[str, float]:
    cfg, sampler = job.bgpo, job.sampler
    started = time.monotonic()
    step_seed = cfg.seed * 1_000_003 + state.step
    gen = torch.Generator().manual_seed(step_seed)
    # 1. Groups: store prompts past the cursor, then task problems.
    groups: list[Group] = []
    if cfg.prompt_source in ("store", "both"):
        rated = store.feedback.rated_after(state.cursor, limit=cfg.prompts_per_step * cfg.group_size)
        if rated:
            state.cursor = rated[-1][0].id
        found, _ = store_groups(rated, cfg.store_model, sampler.gen_length, model.eos_id, decode)
        groups += found[: cfg.prompts_per_step]
    if cfg.prompt_source in ("tasks", "both"):
        groups += task_groups(cfg.tasks, cfg.prompts_per_step - len(groups), step_seed, encode)
    # 2. Rollouts by the current (old) policy; rewards.
    fill_with_rollouts(model, groups, cfg.group_size, sampler, gen, decode)
    all_rewards = [r for g in groups for r in g.rewards]
    # 3.-4. Advantages, masks, old-policy terms.
    prepared = [_prepare(model, objective, g, cfg, gen) for g in groups if len(g.responses) >= 2]
    prepared = [p for p in prepared if bool((p.advantages != 0).any())]
    # 5. Updates.
    metrics = {}
    n_resp = sum(p.responses.shape[0] for p in prepared)
    for u in range(cfg.inner_updates):
        optimizer.zero_grad(set_to_none=True)
        for p in prepared:
            metrics = objective.backward(model, p, n_resp, u)  # this group's share of the batch loss
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm) if prepared else torch.tensor(0.0)
        if prepared:
            optimizer.step()
        metrics["bgpo/grad_norm"] = float(norm)
    # 6. Rollouts into the store.
    if cfg.store_rollouts:
        _store_rollouts(store, groups, cfg, sampler, state, step_seed, model.eos_id,
                        1000 * (time.monotonic() - started))
    state.rewards_since_publish += all_rewards
    metrics.update({
        "bgpo/reward_mean": sum(all_rewards) / max(1, len(all_rewards)),
        "bgpo/groups": float(len(groups)),
        "bgpo/groups_with_signal": float(len(prepared)),
        "bgpo/store_responses": float(sum(s is not None for g in groups for s in g.stored_ids)),
        "bgpo/step_seconds": time.monotonic() - started,
    })
    return metrics


def _prepare(model: MaskedDiffusionLM, objective: Objective, g: Group, cfg, gen: torch.Generator) -> Prepared:
    n = len(g.responses)
    prompt = torch.tensor([g.prompt_ids] * n)
    responses = torch.tensor(g.responses)
    adv = group_normalized_advantages(torch.tensor([g.rewards]))[0]
    draw = draw_masks(n, responses.shape[1], cfg.n_t, gen)
    with torch.no_grad():
        old, seeds = objective.old_terms(model, prompt, responses, draw, gen)
    return Prepared(prompt, responses, adv, draw, old, seeds)


def _store_rollouts(store: Store, groups: list[Group], cfg, sampler, state: TrainerState, step_seed: int,
                    eos_id: int, latency_ms: float) -> None:
    records = []
    for gi, g in enumerate(groups):
        for k, (ids, reward, stored, lps) in enumerate(zip(g.responses, g.rewards, g.stored_ids, g.commit_logprobs)):
            if stored is not None:
                continue
            rid = f"{cfg.run_name}-s{state.step:06d}-g{gi}-r{k}"
            if store.feedback.get_response(rid) is not None:  # a redone step after a resume
                continue
            served, served_lps, finish = served_form(ids, lps, eos_id)
            records.append(ResponseRecord(
                id=rid, api_key_id=cfg.api_key_id, model=cfg.store_model, policy_version=state.version,
                endpoint="completion", prompt_ids=tuple(g.prompt_ids), response_ids=tuple(served),
                behavior_logprobs=tuple(served_lps), finish_reason=finish, temperature=sampler.temperature,
                top_p=1.0, latency_ms=latency_ms, seed=step_seed,
                request_meta={"source": "bgpo", "run": cfg.run_name, "step": state.step, "task": g.task,
                              "reward": reward, "gen_length": sampler.gen_length,
                              "logprobs": "diffusion commit-time logprobs"},
            ))
    if records:
        store.feedback.insert_responses(records)


def _publish(job: BGPOJobConfig, store: Store, model: MaskedDiffusionLM, tokenizer, optimizer,
             state: TrainerState, metrics: dict[str, float]) -> None:
    cfg = job.bgpo
    rewards = state.rewards_since_publish
    meta = {
        "parent": state.version,
        "learner_step": state.step,
        "samples_used": len(rewards),
        "metrics": {**metrics, "bgpo/reward_since_parent": sum(rewards) / max(1, len(rewards)),
                    "bgpo/loss_kind": cfg.loss, "bgpo/n_t": cfg.n_t, "bgpo/run": cfg.run_name},
    }
    # the number is the store's (allocated in the inserting transaction): the state saved here names
    # none, its directory's name does once placed
    saved_state = {**dataclasses.asdict(state), "version": None, "rewards_since_publish": []}
    staging = Path(cfg.out_dir) / f".staging-{os.getpid()}"

    def write(tmp: Path) -> None:
        model.save(tmp, tokenizer)
        (tmp / "publish.json").write_text(json.dumps(meta, indent=2) + "\n")
        torch.save({"state": saved_state, "optimizer": optimizer.state_dict(),
                    "config": dataclasses.asdict(cfg)}, tmp / STATE_FILE)

    save_atomically(staging, write)
    state.version = _record(store, staging, cfg.run_name, state.cursor, meta).version
    state.rewards_since_publish = []
