"""A masked diffusion LM through the whole loop: served by the real server (`diffusion` engine) to the
official `openai` client, logged with its version, rated; then the offline BGPO job (`liveloop bgpo
train`, a separate process) trains on the same store, publishes version 1, and the running server
hot-swaps to it."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
import openai
import pytest

from liveloop.diffusion.model import TinyModelConfig, tiny_model
from liveloop.diffusion.tokenizer import build_tokenizer

from .conftest import ADMIN_KEY, USER_KEY, open_store, start_server, stop_server

NAME = "liveloop-diffusion-test"


@pytest.fixture(scope="module")
def diffusion_dir(tmp_path_factory):
    tok = build_tokenizer()
    d = tmp_path_factory.mktemp("diffusion") / "model"
    tiny_model(TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64), tok, 0).save(d, tok)
    return d


def test_serve_rate_and_retrain_a_diffusion_model(tmp_path, diffusion_dir):
    server = start_server(tmp_path / "srv", diffusion_dir, "diffusion", served_model_name=NAME)
    try:
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key=USER_KEY)
        prompt = [{"role": "user", "content": "countdown: use 3 5 7 to make 22"}]
        reply = client.chat.completions.create(model=NAME, messages=prompt, max_tokens=16, seed=1)
        assert reply.choices[0].finish_reason in ("stop", "length") and reply.model == NAME
        again = client.chat.completions.create(model=NAME, messages=prompt, max_tokens=16, seed=1)
        assert again.choices[0].message.content == reply.choices[0].message.content  # seeded
        streamed = "".join(
            c.choices[0].delta.content or ""
            for c in client.chat.completions.create(model=NAME, messages=prompt, max_tokens=16, seed=1, stream=True)
            if c.choices
        )
        assert streamed == reply.choices[0].message.content
        rated = client.post("/feedback", cast_to=object, body={"response_id": reply.id, "reward": 1})
        assert rated["reward"] == 1

        store = open_store(server)
        try:
            logged = store.feedback.get_response(reply.id)
            assert logged.policy_version == 0 and logged.model == NAME and len(logged.response_ids) >= 1
        finally:
            store.close()

        job = tmp_path / "bgpo.toml"
        job.write_text(f"""
[bgpo]
model_dir = "{diffusion_dir}"
out_dir = "{tmp_path / 'bgpo'}"
store_model = "{NAME}"
prompt_source = "both"
tasks = ["countdown"]
steps = 1
prompts_per_step = 2
group_size = 2
n_t = 2
publish_every = 1
[sampler]
gen_length = 16
block_length = 4
steps = 8
[store]
url = "{server.store_url}"
[build]
out_dir = "{tmp_path / 'unused'}"
""")
        done = subprocess.run([sys.executable, "-m", "liveloop.cli", "bgpo", "train", "--config", str(job), "--no-progress"],
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]

        store = open_store(server)
        try:
            v1 = store.versions.get_version(1)
            assert v1 is not None and v1.parent == 0 and v1.metrics["bgpo/loss_kind"] == "bgpo"
            assert store.feedback.get_cursor("bgpo") >= store.feedback.get_feedback(reply.id)[0].id  # the user's rating was used
            assert store.feedback.counts()["responses"] > 3  # the job's rollouts are stored too
        finally:
            store.close()

        admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
        deadline = time.monotonic() + 60
        while httpx.get(server.base_url + "/healthz", headers=admin).json()["policy_version"] != 1:
            assert time.monotonic() < deadline, "the server did not activate the BGPO version"
            time.sleep(0.3)
        after = client.chat.completions.create(model=NAME, messages=prompt, max_tokens=16, seed=1)
        assert httpx.get(server.base_url + "/admin/versions", headers=admin).json()["serving"] == 1
        assert after.model_extra["policy_version"] == 1
    finally:
        stop_server(server)
