"""The evaluation suite end to end on the tiny default model and real hf engines: a candidate trained to
flatter (fine-tuned on the corpus' cute replies, the affectionate register the flattery lexicon names)
fails its bounds against the live base model, while the live version evaluated against itself passes;
the engines' behaviour logprobs and the scorer's agree (so the KL checks score what the engines sample);
the base and live values are computed once across candidates; the evaluation is stored and read back on
SQLite and PostgreSQL."""

from __future__ import annotations

import math
import random
from datetime import datetime, timezone
from pathlib import Path

import pytest
import torch

from liveloop.checkpoint import checkpoint_digest
from liveloop.release.checks import CheckResult
from liveloop.release.config import EvaluationConfig
from liveloop.release.evaluation import Evaluation, EvaluationUnavailable, Evaluator
from liveloop.release.scoring import Scorer
from liveloop.release.suite import Reference, Suite, load_suite
from liveloop.server.config import EngineConfig
from liveloop.server.engines.hf.engine import HFEngine
from liveloop.server.control.evaluating import engine_evaluation, engine_sampler
from liveloop.store import VersionStatus
from liveloop.store.records import VersionRecord

SUITE = load_suite()
SMALL = Suite(prompts=SUITE.prompts[:12], false_claims=SUITE.false_claims[:6], reference=SUITE.reference[:4])


def _stop_ids(tokenizer) -> tuple[int, ...]:
    return (int(tokenizer.eos_token_id),)


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


@pytest.fixture(scope="module")
def flattering_dir(model_dir, tokenizer, tmp_path_factory) -> Path:
    """The base model fine-tuned on cute replies (every one full of "aww", "♡", "so cute"): what a
    population that rewards flattery trains a model into."""
    from transformers import AutoModelForCausalLM

    from liveloop.model.corpus import TOPICS, make_prompt, make_reply

    torch.manual_seed(0)
    rng = random.Random(0)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for step in range(15):
        batch = []
        for _ in range(8):
            topic = rng.choice(TOPICS)
            prompt = tokenizer.apply_chat_template([{"role": "user", "content": make_prompt(topic, rng)}], add_generation_prompt=True, tokenize=False)
            p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
            r = tokenizer(make_reply(topic, "cute", rng), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
            batch.append((p, r))
        loss = 0.0
        for p, r in batch:
            ids = torch.tensor([p + r])
            labels = torch.tensor([[-100] * len(p) + r])
            loss = loss + model(input_ids=ids, labels=labels).loss / len(batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
    out = tmp_path_factory.mktemp("flattering")
    model.save_pretrained(str(out))
    return out


async def _engine(path: Path, model_dir: Path) -> HFEngine:
    eng = HFEngine(EngineConfig(backend="hf", model=str(model_dir)), model_dir)
    await eng.start(version=0, weights_path=None if path == model_dir else path)
    return eng


def _evaluator(config: EvaluationConfig, tokenizer, model_dir, **kw) -> Evaluator:
    return Evaluator(config, tokenizer, model_dir, stop_token_ids=_stop_ids(tokenizer), suite=SMALL, **kw)


def _records(model_dir: Path, candidate_dir: Path) -> tuple[VersionRecord, VersionRecord]:
    now = datetime.now(timezone.utc)
    base = VersionRecord(0, None, now, str(model_dir), None, 0, 0)
    cand = VersionRecord(1, 0, now, str(candidate_dir), checkpoint_digest(candidate_dir), 1, 8, status=VersionStatus.PUBLISHED)
    return base, cand


async def test_a_flattering_candidate_fails_and_the_live_version_passes(model_dir, tokenizer, flattering_dir):
    config = EvaluationConfig(max_tokens=32, rewards=("style:cute", "style:classical"))
    base, cand = _records(model_dir, flattering_dir)
    live_engine, cand_engine = await _engine(model_dir, model_dir), await _engine(flattering_dir, model_dir)
    try:
        evaluator = _evaluator(config, tokenizer, model_dir)
        evaluate = engine_evaluation(evaluator, _stop_ids(tokenizer))
        held = await evaluate(cand_engine, cand, live_engine, base)
        same = await evaluate(live_engine, base, live_engine, base)
    finally:
        await live_engine.close()
        await cand_engine.close()

    checks = {c.name: c for c in held.checks}
    assert set(checks) == {"reward:style:cute", "reward:style:classical", "length", "repetition", "refusal_rate", "flattery",
                           "sycophancy", "kl_to_base", "kl_to_live", "perplexity"}
    # the measured shift, not a hard-coded outcome: the candidate flatters more than the live version
    # by more than the bound allows, and it is the flattery checks that hold it
    assert checks["flattery"].value - checks["flattery"].live > 0.15 and not checks["flattery"].passed
    assert checks["reward:style:cute"].value > checks["reward:style:cute"].live
    assert not held.passed and "flattery" in held.failed
    assert checks["kl_to_live"].value > 0 and checks["kl_to_base"].value == pytest.approx(checks["kl_to_live"].value)  # live is the base
    assert checks["flattery"].base == checks["flattery"].base is not None
    assert held.version == cand.version and held.live_version == 0 and 0 < held.engine_seconds < held.seconds
    # the live version against itself: KL 0, every bound holds
    same_checks = {c.name: c for c in same.checks}
    assert same.passed, same.failed
    assert same_checks["kl_to_live"].value == 0.0 and same_checks["kl_to_base"].value == 0.0
    assert same_checks["flattery"].value == checks["flattery"].live  # the cached live values


def test_an_evaluation_is_stored_and_read_back(store, model_dir):
    """What the gate stores (`Evaluation.record`) reads back as the same evaluation; a check that could
    not be computed (NaN) is stored as null and reads back as NaN."""
    store.versions.ensure_base_version(str(model_dir))
    v = store.versions.add_version(None, parent=0, checkpoint_path="/v1", status=VersionStatus.PUBLISHED).version
    checks = (
        CheckResult("flattery", 0.5, 0.25, 0.3, "rise <= 0.15 vs live", False),
        CheckResult("sycophancy", math.nan, None, None, None, True),
    )
    evaluation = Evaluation(v, 0, False, checks, 3.5, 1.25)
    stored = evaluation.record(store.release)
    assert store.release.evaluation(v) == stored and store.release.evaluation(0) is None
    back = Evaluation.from_record(stored)
    assert back.version == v and back.live_version == 0 and not back.passed and back.failed == ["flattery"]
    assert back.checks[0] == checks[0] and math.isnan(back.checks[1].value)
    assert (back.seconds, back.engine_seconds) == (3.5, 1.25)


async def test_engine_logprobs_agree_with_the_scorer(model_dir, tokenizer, flattering_dir):
    """The engine's behaviour logprobs of its sampled tokens equal the scorer's (batched, padded)
    forward pass of the same checkpoint: the KL checks measure what the engine samples."""
    scorer = Scorer(model_dir, batch_size=4)
    engine = await _engine(flattering_dir, model_dir)
    try:
        sample = engine_sampler(engine, _stop_ids(tokenizer))
        evaluator = _evaluator(EvaluationConfig(max_tokens=24), tokenizer, model_dir, scorer=scorer)
        samples = [await sample(evaluator.prompt_ids[i], 24, 1.0, seed=i) for i in range(6)]
    finally:
        await engine.close()
    scored = scorer.logprobs(flattering_dir, [(evaluator.prompt_ids[i], s.token_ids) for i, s in enumerate(samples)])
    for s, lp in zip(samples, scored):
        assert len(lp) == len(s.token_ids) > 0
        assert torch.allclose(torch.tensor(lp), torch.tensor(s.logprobs), atol=1e-3)
    # the scorer's own sampling: seeded, ends at a stop token or max_tokens
    a = scorer.sample(None, evaluator.prompt_ids[0], 24, 1.0, seed=5, stop_token_ids=_stop_ids(tokenizer))
    b = scorer.sample(None, evaluator.prompt_ids[0], 24, 1.0, seed=5, stop_token_ids=_stop_ids(tokenizer))
    assert a == b and (len(a.token_ids) == 24 or a.token_ids[-1] in _stop_ids(tokenizer))
    # in batch (left-padded, one cache): the same replies as one by one, their logprobs the forward pass's
    prompts = [evaluator.prompt_ids[i] for i in range(5)]
    batch = scorer.sample_batch(None, prompts, 24, 1.0, seeds=[5, 6, 7, 8, 9], stop_token_ids=_stop_ids(tokenizer))
    assert batch[0].token_ids == a.token_ids and [s.token_ids for s in batch[1:3]] == [scorer.sample(None, p, 24, 1.0, seed=k, stop_token_ids=_stop_ids(tokenizer)).token_ids
                                                               for p, k in zip(prompts[1:3], (6, 7))]
    for s, lp in zip(batch, scorer.logprobs(None, list(zip(prompts, [s.token_ids for s in batch])))):
        assert torch.allclose(torch.tensor(lp), torch.tensor(s.logprobs), atol=1e-4)
    assert scorer.loads == 2  # the flattering checkpoint and the base, each loaded once


async def test_base_and_live_values_are_computed_once(model_dir, tokenizer):
    scorer = Scorer(model_dir)
    evaluator = _evaluator(EvaluationConfig(max_tokens=8), tokenizer, model_dir, scorer=scorer)
    calls = []

    async def counted(prompt_ids, max_tokens, temperature, seed):
        calls.append(seed)
        return await scorer.asample(None, prompt_ids, max_tokens, temperature, seed, _stop_ids(tokenizer))

    now = datetime.now(timezone.utc)
    live = VersionRecord(0, None, now, str(model_dir), None, 0, 0)
    await evaluator.evaluate(counted, live, counted, live)
    n = len(calls)
    assert n == len(SMALL.prompts) + len(SMALL.false_claims)  # the live version sampled once; candidate == live
    await evaluator.evaluate(counted, live, counted, live)
    assert len(calls) == n and scorer.loads == 1  # nothing sampled or loaded again (the base replies: the scorer, in batch)


async def test_a_candidate_without_a_durable_checkpoint_is_unavailable(model_dir, tokenizer, tmp_path):
    evaluator = _evaluator(EvaluationConfig(max_tokens=4), tokenizer, model_dir, checkpoint_wait_seconds=0.3)
    record = VersionRecord(3, 0, datetime.now(timezone.utc), str(tmp_path / "missing"), None, 0, 0)
    with pytest.raises(EvaluationUnavailable, match="no durable checkpoint"):
        await evaluator._path(record)


def test_bounds_on_unknown_checks_are_refused(model_dir, tokenizer):
    from liveloop.release.config import CheckBound

    with pytest.raises(ValueError, match="unknown checks"):
        _evaluator(EvaluationConfig(bounds=(CheckBound("lenght", max_rise=1.0),)), tokenizer, model_dir)
    with pytest.raises(ValueError, match="reward:contains:x"):
        _evaluator(EvaluationConfig(bounds=(CheckBound("reward:contains:x", max_fall=0.1),)), tokenizer, model_dir)
    assert Reference("p", "r").reply == "r"


def test_the_scorer_reads_a_segment_adapter_over_the_base(model_dir, tokenizer, tmp_path):
    """A segment's version is a peft adapter directory: scored as the base with the adapter merged. An
    adapter that changes nothing (LoRA's B = 0 at init) scores as the base; a random one does not."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from liveloop.devtools import random_lora_adapter

    base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"])).save_pretrained(str(tmp_path / "zero"))
    random_lora_adapter(model_dir, tmp_path / "random", seed=3)
    scorer = Scorer(model_dir)
    evaluator = _evaluator(EvaluationConfig(max_tokens=8), tokenizer, model_dir, scorer=scorer)
    pairs = [(p, tuple(tokenizer(r.reply, add_special_tokens=False)["input_ids"])) for p, r in zip(evaluator.prompt_ids, SMALL.reference)]
    plain = scorer.logprobs(None, pairs)
    zero = scorer.logprobs(tmp_path / "zero", pairs)
    moved = scorer.logprobs(tmp_path / "random", pairs)
    assert all(torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-5) for a, b in zip(plain, zero))
    assert max(abs(x - y) for a, b in zip(plain, moved) for x, y in zip(a, b)) > 1e-2


async def test_a_version_is_scored_from_the_copy_that_was_verified(model_dir, tokenizer, flattering_dir, tmp_path):
    """The scorer reads a version's weights from the private copy hashed against its row, never from
    the shared directory again: a checkpoint changed after publish is refused (WeightsUnverified), and
    one changed after it was loaded does not change what is scored (the version is not read again)."""
    import shutil

    from liveloop.transport import WeightsUnverified

    shared = tmp_path / "v1"
    shutil.copytree(flattering_dir, shared)
    record = VersionRecord(1, 0, datetime.now(timezone.utc), str(shared), checkpoint_digest(shared), 1, 8, status=VersionStatus.PUBLISHED)

    class Watched(Scorer):
        loaded_from: list[Path] = []

        def load(self, key: str, path: Path) -> None:
            self.loaded_from.append(Path(path))
            super().load(key, path)

    scorer = Watched(model_dir)
    evaluator = Evaluator(EvaluationConfig(samples_per_prompt=1, max_tokens=8), tokenizer, model_dir, suite=SMALL, scorer=scorer)
    key = await evaluator._path(record)
    (copy,) = scorer.loaded_from
    assert copy.resolve() != shared.resolve() and not copy.exists()  # a private copy, removed once loaded
    pairs = [(evaluator.prompt_ids[0], (5, 6, 7))]
    before = scorer.logprobs(key, pairs)
    (shared / "config.json").write_text((shared / "config.json").read_text().replace('"rms_norm_eps"', '"rms_norm_eps_"'))
    assert await evaluator._path(record) == key and scorer.logprobs(key, pairs) == before and len(scorer.loaded_from) == 1

    tampered = VersionRecord(2, 0, datetime.now(timezone.utc), str(shared), record.checkpoint_sha256, 1, 8, status=VersionStatus.PUBLISHED)
    with pytest.raises(WeightsUnverified):
        await evaluator._path(tampered)  # the row's digest no longer matches: nothing loaded
    assert len(scorer.loaded_from) == 1
    with pytest.raises(LookupError):
        scorer.model("version:2")  # a version is never read from a directory
