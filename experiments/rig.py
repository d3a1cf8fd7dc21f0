"""The learning rig: simulated users, the real store and the real learner in one process, no server.

    rig = LearningRig(workdir, model_dir, learner_config, critic_config, segments=segments_config)   # adapters: [segments]
    replies = rig.sample([Ask("cozy", "Tell me about cats.")] * 4)   # from cozy's live weights
    rig.rate(replies, [reward(r.text) for r in replies])            # stored responses + ratings
    rig.train()                                                      # the learner catches up

What it is for: learning questions asked over many seeds (how many ratings until an objective shows,
which lever moves that, how methods re-adapt after a preference switch), which the served loop answers
at about 3 ratings a second and this rig at about 10 on this machine.

What is real and what is not. The responses, the ratings, the learner's reads (`rated_after`, per
segment), its step (masks, critic, GAE, step-size control, trust region, KL anchor) and the baselines
are the production code on a real SQLite store. Replies are sampled from the learner's own live weights
(a segment's adapter with the others off, or the whole policy), `lag` requests at a time: the learner
is up to `lag` ratings behind what is served, as the server's users are (the served benchmark lets it
fall 8 behind), so the behaviour log-probabilities and the ratio mask see real staleness. Nothing is
published: publishing and swapping are measured by the served benchmarks (bench/feedback_to_live.py),
and a version the server would serve is exactly the weights the rig samples from.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from liveloop.critic.config import CriticConfig
from liveloop.learner.config import LearnerConfig
from liveloop.learner.lanes import SegmentLanes, build_learner
from liveloop.learner.online import OnlineLearner
from liveloop.rl.rollout import Rollout, chat_prompt_ids
from liveloop.segments import SEGMENT_KEY, SegmentsConfig, segment_of
from liveloop.store import FeedbackRecord, ResponseRecord, Store, StoreConfig

NEVER = 10**9
USERS = 30  # simulated users (API keys) per rig: ratings rotate through them, as many users' would


@dataclass(frozen=True)
class Ask:
    """One request: the segment it names (None: no segment), the user's prompt, and an optional group
    tag (GRPO's users ask one prompt G times; learner/methods.py groups by it)."""

    segment: str | None
    prompt: str
    group: str | None = None


@dataclass(frozen=True)
class Reply:
    ask: Ask
    rollout: Rollout
    lane: str | None  # the adapter segment that served it (None: the whole policy)
    version: int  # the version whose weights sampled it (the lane's or the learner's)

    @property
    def text(self) -> str:
        return self.rollout.text


@torch.no_grad()
def sample_batch(model, tokenizer, prompts: Sequence[list[int]], max_tokens: int, generator: torch.Generator,
                 temperature: float = 1.0) -> list[Rollout]:
    """Replies to several prompts at once (left-padded, one KV cache), each token drawn from the full
    distribution at `temperature` with its log-probability at temperature 1, as the engines record it.
    A reply ends at the end-of-sequence token (kept, like `rl.rollout.sample_reply`) or at `max_tokens`."""
    was_training = model.training
    model.eval()
    n, width = len(prompts), max(len(p) for p in prompts)
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    ids = torch.full((n, width), pad, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    position = (mask.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=ids, attention_mask=mask, position_ids=position, use_cache=True)
    tokens: list[list[int]] = [[] for _ in range(n)]
    logprobs: list[list[float]] = [[] for _ in range(n)]
    done = [False] * n
    for _ in range(max_tokens):
        logits = out.logits[:, -1].float()
        lp = torch.log_softmax(logits, -1)
        chosen = torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=generator)[:, 0]
        for i in range(n):
            if not done[i]:
                t = int(chosen[i])
                tokens[i].append(t)
                logprobs[i].append(float(lp[i, t]))
                done[i] = t == eos
        if all(done):
            break
        mask = torch.cat([mask, torch.ones((n, 1), dtype=torch.long)], dim=1)
        position = position[:, -1:] + 1
        out = model(input_ids=chosen[:, None], attention_mask=mask, position_ids=position,
                    past_key_values=out.past_key_values, use_cache=True)
    model.train(was_training)
    return [Rollout(list(p), t, lp, tokenizer.decode(t, skip_special_tokens=True))
            for p, t, lp in zip(prompts, tokens, logprobs)]


class LearningRig:
    def __init__(self, workdir: Path, model_dir: Path, learner: LearnerConfig, critic: CriticConfig,
                 max_tokens: int = 48, seed: int = 0, segments: SegmentsConfig = SegmentsConfig()):
        from transformers import AutoTokenizer

        learner = dataclasses.replace(learner, publish_every_steps=NEVER)  # nothing is published (the docstring)
        self.workdir, self.model_dir, self.config, self.max_tokens = Path(workdir), Path(model_dir), learner, max_tokens
        self.segments = segments
        self.store = Store(StoreConfig(url=f"sqlite:///{self.workdir / 'liveloop.db'}"))
        self.store.migrate()
        self.store.versions.ensure_base_version(str(self.model_dir.resolve()))
        self.learner: OnlineLearner | SegmentLanes = build_learner(
            learner, critic, self.model_dir, segments=segments,
            feedback=self.store.feedback, versions=self.store.versions, operator=self.store.operator, episodes=self.store.episodes,
        )
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.model_dir))
        self.generator = torch.Generator().manual_seed(seed)
        self._users = itertools.cycle([f"user-{i:02d}" for i in range(USERS)])
        self.steps = 0

    def close(self) -> None:
        self.store.close()

    # -- which weights serve a segment -----------------------------------------------------------------
    def lane(self, segment: str | None) -> str | None:
        """The adapter lane a request of `segment` is served and trained by (None: the whole policy)."""
        return segment_of({SEGMENT_KEY: segment}, self.segments)

    def _learner_of(self, lane: str | None) -> OnlineLearner:
        return self.learner if lane is None else self.learner.lanes[lane]

    @contextlib.contextmanager
    def serving(self, segment: str | None) -> Iterator[tuple[torch.nn.Module, str | None, int]]:
        """The model that serves `segment` now (its adapter on, or the whole policy), its lane and version."""
        lane = self.lane(segment)
        learner = self._learner_of(lane)
        if lane is None:
            yield learner.policy, None, learner.state.version
            return
        with learner.adapters.active(lane) as model:
            yield model, lane, learner.state.version

    # -- the users' side -------------------------------------------------------------------------------
    def sample(self, asks: Sequence[Ask], generator: torch.Generator | None = None) -> list[Reply]:
        """Replies to `asks`, each from its segment's live weights (asks of one segment in one batch)."""
        replies: dict[int, Reply] = {}
        for segment in dict.fromkeys(a.segment for a in asks):
            idx = [i for i, a in enumerate(asks) if a.segment == segment]
            prompts = [chat_prompt_ids(self.tokenizer, asks[i].prompt) for i in idx]
            with self.serving(segment) as (model, lane, version):
                rollouts = sample_batch(model, self.tokenizer, prompts, self.max_tokens, generator or self.generator)
            replies |= {i: Reply(asks[i], r, lane, version) for i, r in zip(idx, rollouts)}
        return [replies[i] for i in range(len(asks))]

    def probe(self, segment: str | None, prompts: Sequence[str], reward, seed: int = 12345) -> float:
        """The mean reward of `segment`'s live weights on fixed prompts with a fixed sampling seed (the same
        prompts and seed before and after training: a paired measurement)."""
        generator = torch.Generator().manual_seed(seed)
        replies = []
        for start in range(0, len(prompts), 16):
            replies += self.sample([Ask(segment, p) for p in prompts[start:start + 16]], generator)
        return sum(reward(r.text) for r in replies) / len(replies)

    def rate(self, replies: Sequence[Reply], rewards: Sequence[float], user: str | None = None) -> None:
        """Store the replies as served responses and each user's thumbs (reward 0 or 1): users in turn,
        or all from `user` (one API key: what the influence caps hold back)."""
        records, ratings = [], []
        for reply, reward in zip(replies, rewards):
            user_id, rid = user or next(self._users), f"rig-{uuid.uuid4().hex}"
            r = reply.rollout
            finish = "stop" if r.response_ids and r.response_ids[-1] == self.tokenizer.eos_token_id else "length"
            meta = {"segment": reply.ask.segment} if reply.ask.segment is not None else {}
            if reply.ask.group is not None:
                meta["group"] = reply.ask.group
            records.append(ResponseRecord(
                id=rid, api_key_id=user_id, model="rig", policy_version=reply.version, endpoint="chat",
                prompt_ids=tuple(r.prompt_ids), response_ids=tuple(r.response_ids), behavior_logprobs=tuple(r.logprobs),
                finish_reason=finish, temperature=1.0, top_p=1.0, latency_ms=0.0, request_meta=meta, segment=reply.lane,
            ))
            ratings.append(FeedbackRecord(rid, user_id, int(reward)))
        self.store.feedback.insert_responses(records)
        for rating in ratings:
            self.store.feedback.put_feedback(rating)

    # -- the learner's side ----------------------------------------------------------------------------
    def train(self) -> int:
        """Step every lane until none has a rating left to take; returns the steps taken."""
        learners = [self.learner] if isinstance(self.learner, OnlineLearner) else list(self.learner.lanes.values())
        taken = 0
        progressed = True
        while progressed:
            progressed = False
            for learner in learners:  # lanes take turns, one step each, as learner/loop.py runs them
                if learner.step():
                    taken += 1
                    progressed = True
        self.steps += taken
        return taken

    def metrics(self, segment: str | None = None) -> dict[str, float]:
        """The last step's metrics of the learner (or of `segment`'s lane)."""
        return dict(self._learner_of(self.lane(segment)).state.last_metrics)
