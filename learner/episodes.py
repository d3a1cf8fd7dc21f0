"""What the learner's methods read: ratings in arrival order, and for each rating its sample, which for
a turn of an agent's episode is the whole trajectory up to the rated turn (rl/episodes.py).

    samples = EpisodeSamples(store.feedback, store.episodes, max_episode_tokens)
    for f, r in samples.rated_after(cursor, n): sample = samples.sample(f, r)   # None: not trained (counted)

What a rating means: it rates the trajectory up to and including the turn it was given for; its
reward sits on that turn's last token, and every earlier turn's action tokens get their share through
the GAE (the critic sees the whole trajectory). A rating of a middle turn is therefore the reward of the
shorter trajectory that ended there, and a later rating of the same episode by the same rater credits
only the turns after it (the earlier ones become context): each action token is trained once per
rater, by the first rating at or after its turn. So influence caps, which count samples, count
episodes.

Two ablations for experiments/agent.py (`[learner] episode_credit = "last"`, `episode_observations =
"actions"`); the defaults are SAO's.

Not trained, counted in `stats()` (`learner/episodes_skipped_*`): an episode a turn of which is gone
(`broken`: deleted under it, or a restore), one longer than `max_episode_tokens` (`too_long`; the
prompt is the context every turn was sampled in, so it cannot be cut without changing what the
behaviour logprobs are of), one whose turns do not sit where their links say (`mismatch`). Nor is a
sample the learner cannot score (`check`: rl/batch.py `scorable`; a stored reply whose tokens its grammar
forbids, say): skipped with a warning naming the response, counted in `learner/skipped_samples` and
`learner/skipped_samples_<reason>` (alarmed; `memory`: its step ran out of memory alone twice, learner/memory.py),
consumed, never retried. One drawn so it cannot be replayed (liveloop/sampling.py): `untrained_samples_sampling`."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Protocol

from liveloop.rl.batch import Sample, Unscorable
from liveloop.rl.episodes import EpisodeMismatch, episode_sample
from liveloop.store.records import Episode, StoredFeedback, StoredResponse

log = logging.getLogger(__name__)


class RatingReads(Protocol):
    """The store read a learner's ratings come from: the trainable ratings past a feedback id, in
    arrival order, each with its response (the store's feedback part, or one segment's view of it:
    learner/online.py `SegmentRatings`)."""

    def rated_after(self, feedback_id: int, limit: int) -> list[tuple[StoredFeedback, StoredResponse]]: ...


class EpisodeReads(Protocol):
    """The store reads an agent's episode takes (the store's episodes part, store/episodes.py)."""

    def episode(self, response_id: str) -> Episode | None: ...

    def rated_turns(self, turn_ids: Sequence[str], api_key_id: str, before_feedback_id: int) -> set[str]: ...


class RatedFeed(Protocol):
    """What a learning method reads its batches from (learner/methods.py `next_batch`): the ratings in
    arrival order and each one's sample (None: it trains nothing). `EpisodeSamples` is the one the
    learner builds, over the two store reads above."""

    def rated_after(self, feedback_id: int, limit: int) -> list[tuple[StoredFeedback, StoredResponse]]: ...

    def sample(self, feedback: StoredFeedback, response: StoredResponse) -> Sample | None: ...


class EpisodeSamples:
    """The learner's `RatedFeed`: ratings from `ratings`, each made a sample, with its episode read
    from `episode_reads` when the rated response is a later turn of one."""

    def __init__(
        self, ratings: RatingReads, episode_reads: EpisodeReads, max_episode_tokens: int, credit: str = "all",
        observations: str = "skip", check: Callable[[Sample], Sample] | None = None,
    ):
        self.ratings, self.episode_reads, self.max_tokens = ratings, episode_reads, max_episode_tokens
        self.credit, self.observations = credit, observations  # `[learner] episode_credit`, `episode_observations`
        self.check = check  # the sample made scorable, or Unscorable (None: not checked)
        self.skipped: Counter[str] = Counter()
        self.unscorable: Counter[str] = Counter()  # samples `check` refused, by reason
        self.untrained: Counter[str] = Counter()  # samples drawn so that the learner cannot score them, by design
        self.episodes = 0  # multi-turn samples made
        self.turns = 0  # turns they covered

    def rated_after(self, feedback_id: int, limit: int) -> list[tuple[StoredFeedback, StoredResponse]]:
        return self.ratings.rated_after(feedback_id, limit)

    def sample(self, feedback: StoredFeedback, response: StoredResponse) -> Sample | None:
        """The sample a rating trains (None: it trains nothing; counted)."""
        sample = self._sample(feedback, response)
        if sample is None or self.check is None:
            return sample
        try:
            return self.check(sample)
        except Unscorable as exc:
            if exc.reason == "sampling":
                self.untrained[exc.reason] += 1
                log.info("rating %d of response %s not trained: %s", feedback.id, response.id, exc.detail)
                return None
            self.unscorable[exc.reason] += 1
            log.warning("rating %d of response %s not trained, it cannot be scored: %s", feedback.id, response.id, exc)
            return None

    def not_trained(self, reason: str) -> None:
        """A sample the learner took and could not train after all (a step on it alone ran out of memory:
        learner/memory.py): counted with the unscorable ones, so alarmed as a skipped sample."""
        self.unscorable[reason] += 1

    def _sample(self, feedback: StoredFeedback, response: StoredResponse) -> Sample | None:
        if getattr(response, "parent_id", None) is None:
            return self._bounded(Sample.from_rated(feedback, response))
        episode = self.episode_reads.episode(response.id)
        if episode is None or not episode.complete:
            return self._skip("broken")
        turns = episode.turns
        rated = self.episode_reads.rated_turns([t.id for t in turns[:-1]], feedback.api_key_id, feedback.id)
        credited = max((k for k, t in enumerate(turns[:-1]) if t.id in rated), default=-1)
        if self.credit == "last":  # the ablation: the rated turn alone trains, the turns before are context
            credited = len(turns) - 2
        try:
            sample = episode_sample(turns, episode.prompt_ids, float(feedback.reward), feedback.api_key_id, credited,
                                    observations_as_actions=self.observations == "actions")
        except EpisodeMismatch as exc:
            log.error("episode ending at %s not trained: %s", response.id, exc)
            return self._skip("mismatch")
        sample = self._bounded(sample)
        if sample is not None:
            self.episodes += 1
            self.turns += len(turns)
        return sample

    def _bounded(self, sample: Sample) -> Sample | None:
        if self.max_tokens and len(sample.prompt_ids) + len(sample.response_ids) > self.max_tokens:
            return self._skip("too_long")
        return sample

    def _skip(self, reason: str) -> None:
        self.skipped[reason] += 1
        return None

    def stats(self) -> dict[str, float]:
        out = {"learner/episodes": float(self.episodes), "learner/episode_turns": float(self.turns),
               "learner/skipped_samples": float(sum(self.unscorable.values()))}
        out |= {f"learner/skipped_samples_{reason}": float(n) for reason, n in self.unscorable.items()}
        out |= {f"learner/untrained_samples_{reason}": float(n) for reason, n in self.untrained.items()}
        return out | {f"learner/episodes_skipped_{reason}": float(n) for reason, n in self.skipped.items()}
