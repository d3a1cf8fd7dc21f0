"""A step that runs out of memory: what the learner does instead of crashing (learner/online.py).

    retreat = MemoryRetreat()
    most = retreat.batch_limit                  # None, or 1 while a failed batch is retried sample by sample
    if out_of_memory(exc): verdict = retreat.failed(len(samples), last_id)   # "retry" or "pass"
    retreat.stepped(cursor)                     # a step stood: the limit ends once past the failed batch

An allocation that fails inside a step (torch's CPU allocator, CUDA's `OutOfMemoryError`, Python's
`MemoryError`) is the rated reply's size meeting the machine's memory, not a bug: crashing would restart
the learner on the same batch, fail again, and after the supervisor's few restarts stop learning for
every key. Instead the learner drops the step (its gradients; and if the policy's update had begun, it
reloads the version it last published), hands its heap back and retries: a batch of several ratings one
rating at a time, a lone rating once more (the peak may have been the engine's, beside it). A rating
that fails twice (alone, or last in its batch and then alone), or a group the method cannot split
(GRPO) that fails twice, is not trained: the cursor moves past it, counted as
`learner/skipped_samples_memory` (alarmed like every skipped sample); the rating and its reply stay in
the store for a replay on a larger machine. The served version is never touched: nothing is published
from a failed step.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

log = logging.getLogger(__name__)

_ALLOCATOR_WORDS = ("can't allocate memory", "out of memory", "not enough memory")


def out_of_memory(exc: BaseException) -> bool:
    """Whether `exc` is an allocation that failed (and not some other fault of the step)."""
    if isinstance(exc, MemoryError):
        return True
    import torch

    if isinstance(exc, torch.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and any(w in str(exc) for w in _ALLOCATOR_WORDS)


@dataclass
class MemoryRetreat:
    """Where the learner stands after steps that ran out of memory (see the module docstring)."""

    batch_limit: int | None = None  # 1 while the ratings of a failed batch are retried one by one
    until: int = -1  # the last feedback id of the failed batch: past it, the limit ends
    failed_alone: int | None = None  # the last feedback id of a batch that failed at the limit once
    to_pass: int | None = None  # the last feedback id of a batch that failed at the limit twice
    failures: int = 0  # steps that ran out of memory, all told

    def failed(self, batch: int, last_id: int) -> str:
        """A step of `batch` ratings through feedback `last_id` ran out of memory: "retry" it (one rating at
        a time, or once more alone) or "pass" it: at once where the learner's cursor did not move, else
        (after a reload, which trains again what was not published) when it comes up (`passes`)."""
        self.failures += 1
        self.until = max(self.until, last_id)
        if batch > 1 and self.batch_limit is None:  # its last rating has failed once (a group's: the group)
            self.batch_limit, self.failed_alone = 1, last_id
            return "retry"
        self.batch_limit = 1  # a batch the method cannot split (a GRPO group) is retried and passed whole
        if self.failed_alone != last_id:
            self.failed_alone = last_id
            return "retry"
        self.failed_alone, self.to_pass = None, last_id
        return "pass"

    def passes(self, last_id: int) -> bool:
        """Whether the batch through `last_id` is the one to pass untrained (then it is passed: forgotten here)."""
        if self.to_pass is None or last_id != self.to_pass:
            return False
        self.to_pass = None
        return True

    def stepped(self, cursor: int) -> None:
        """A step stood, or a batch was passed, with the learner's cursor now at `cursor`."""
        if self.failed_alone is not None and cursor >= self.failed_alone:
            self.failed_alone = None
        if self.batch_limit is not None and cursor >= self.until and self.to_pass is None:
            log.info("learner: past the batch that ran out of memory, batches grow again")
            self.batch_limit = None

    def stats(self) -> dict[str, float]:
        """`learner/out_of_memory_steps`, once there has been one (until then the metrics are those of a
        learner without this guard: learner/reference_step.py's)."""
        return {"learner/out_of_memory_steps": float(self.failures)} if self.failures else {}
