"""An agent's tool loop through the real server (hf engine, in-process learner) and the official
`openai` client, the client running the tool: the turns link into one episode in the store by the resent
conversation alone, the rendered tool result sits between the turns as observation tokens, another key
resending the same conversation starts its own episode, a Responses API chain links by
`previous_response_id`, and a thumbs on the final answer trains the whole trajectory into a new version."""

from __future__ import annotations

import json

import httpx
import numpy as np
import openai
import pytest
from transformers import AutoTokenizer

from liveloop.devtools import wait_until

from .test_operator import browser  # noqa: F401 (the headless Chromium fixture)
from .conftest import ADMIN_KEY, ASK, TOOLS, USER_KEY, USER_KEY_2, open_store, scored, start_server, stop_server

MODEL = "liveloop-tiny"
LEARNER = """
publish_every_steps = 1
publish_every_seconds = 1.0
poll_seconds = 0.1
kl_coef = 0.0
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory, model_dir):
    s = start_server(tmp_path_factory.mktemp("episodes"), model_dir, "hf", learner=LEARNER)
    yield s
    stop_server(s)


@pytest.fixture
def store(server):
    s = open_store(server)
    yield s
    s.close()


def _tool_loop(client: openai.OpenAI, seed: int) -> tuple[str, str, str]:
    """Two turns: a forced call of `calc`, the client's result, a free answer. Returns (first id, second id, result)."""
    first = client.chat.completions.create(model=MODEL, messages=ASK, tools=TOOLS, tool_choice="required",
                                           parallel_tool_calls=False, max_tokens=160, seed=seed)
    (call,) = first.choices[0].message.tool_calls
    args = json.loads(call.function.arguments)
    result = str({"add": 2 + args["a"], "mul": 2 * args["a"]}[args["op"]])
    history = ASK + [first.choices[0].message, {"role": "tool", "tool_call_id": call.id, "content": result}]
    second = client.chat.completions.create(model=MODEL, messages=history, tools=TOOLS, max_tokens=16, seed=seed + 1)
    return first.id, second.id, result


def test_a_tool_loop_is_one_episode_with_the_tool_result_as_observation(server, store, model_dir):
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key=USER_KEY, max_retries=0)
    first, second, result = _tool_loop(client, seed=1)
    t1, t2 = store.feedback.get_response(first), store.feedback.get_response(second)
    assert (t2.parent_id, t2.root_id, t2.turn) == (first, first, 1)
    assert t2.prefix_tokens is not None  # the template re-rendered the call token for token
    episode = store.episodes.episode(second)
    from liveloop.rl.episodes import episode_sample

    sample = episode_sample(episode.turns, episode.prompt_ids, 1.0)
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    mask = sample.action_mask.tolist()
    first_len = t2.prefix_tokens - len(t1.prompt_ids)
    assert mask[:first_len] == [1] * first_len and mask[len(sample.response_ids) - len(t2.response_ids):] == [1] * len(t2.response_ids)
    observed = tok.decode(sample.response_ids[first_len : len(sample.response_ids) - len(t2.response_ids)])
    assert set(mask[first_len : len(mask) - len(t2.response_ids)]) == {0}
    assert result in observed and "tool" in observed  # the rendered tool turn is what the mask leaves out
    assert '"name": "calc"' in tok.decode(sample.response_ids[:first_len])  # the call is the first turn's action
    # every turn's tokens sit in the context they were sampled in: the learner's scoring of the episode
    # (the first turn's grammar replayed over its span) gives back each action token's behaviour logprob
    scored_now = scored(model_dir, sample)
    actions = sample.action_mask.astype(bool)
    assert np.abs(scored_now[actions] - sample.behavior_logprobs[actions]).max() < 1e-3
    # the same conversation resent by another key is that key's own first turn
    other = openai.OpenAI(base_url=server.base_url + "/v1", api_key=USER_KEY_2, max_retries=0)
    history = store.conversations.get(second, t2.api_key_id, ("chat",)).messages
    again = other.chat.completions.create(model=MODEL, messages=history, tools=TOOLS, max_tokens=8, seed=9)
    assert store.feedback.get_response(again.id).parent_id is None


def test_a_responses_chain_is_one_episode(server, store):
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key=USER_KEY, max_retries=0)
    a = client.responses.create(model=MODEL, input="Tell me about the moon.", max_output_tokens=12)
    b = client.responses.create(model=MODEL, input="And the sea?", previous_response_id=a.id, max_output_tokens=12)
    row = store.feedback.get_response(b.id)
    assert (row.parent_id, row.turn) == (a.id, 1)
    assert store.episodes.view(b.id).turns[1].linked_by == "previous_response"


def test_a_rating_of_the_final_answer_trains_the_whole_episode(server, store):
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key=USER_KEY, max_retries=0)
    _, second, _ = _tool_loop(client, seed=5)
    before = max(v.version for v in store.versions.list_versions())
    with httpx.Client(base_url=server.base_url, headers={"Authorization": f"Bearer {USER_KEY}"}) as c:
        assert c.post("/v1/feedback", json={"response_id": second, "reward": 1}).status_code == 200
    wait_until(lambda: max(v.version for v in store.versions.list_versions()) > before, timeout=120, what="a version trained on the episode")
    trained = max(store.versions.list_versions(), key=lambda v: v.version)
    assert trained.metrics.get("learner/episodes", 0) >= 1 and trained.metrics.get("learner/episode_turns", 0) >= 2


def test_operators_see_an_episodes_turns_tool_calls_and_reward(server, store):
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key=USER_KEY, max_retries=0)
    first, second, _ = _tool_loop(client, seed=7)
    with httpx.Client(base_url=server.base_url, headers={"Authorization": f"Bearer {USER_KEY}"}) as c:
        assert c.post("/v1/feedback", json={"response_id": second, "reward": 0}).status_code == 200
    with httpx.Client(base_url=server.base_url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as admin:
        view = admin.get(f"/admin/episodes/{second}").json()
        assert (view["id"], view["turn_count"], view["reward"], view["complete"]) == (first, 2, 0, True)
        assert view["turns"][0]["tool_calls"] == ["calc"] and view["turns"][1]["observation_tokens"] > 0
        listed = admin.get("/admin/episodes", params={"limit": 50}).json()["data"]
        assert second in [e["last_turn"] for e in listed]
        assert admin.get("/admin/episodes/nope").status_code == 404
        assert admin.get("/admin/episodes/" + "x" * 65).status_code == 400
    with httpx.Client(base_url=server.base_url, headers={"Authorization": f"Bearer {USER_KEY}"}) as user:
        assert user.get(f"/admin/episodes/{second}").status_code in (401, 403)  # operators only


def test_the_dashboard_shows_the_episodes(server, store, browser):  # noqa: F811
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key=USER_KEY, max_retries=0)
    first, second, _ = _tool_loop(client, seed=11)
    wait = WebDriverWait(browser, 30, ignored_exceptions=[StaleElementReferenceException])
    browser.get(server.base_url + "/dashboard")
    wait.until(EC.presence_of_element_located((By.ID, "key"))).send_keys(ADMIN_KEY)
    browser.find_element(By.ID, "sign-in").click()
    wait.until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-loaded") == "true")
    row = browser.find_element(By.CSS_SELECTOR, f'#episodes tbody tr[data-last-turn="{second}"]')
    assert row.get_attribute("data-episode") == first
    assert row.find_element(By.CSS_SELECTOR, "td.turns").text == "2" and "calc" in row.find_element(By.CSS_SELECTOR, "td.calls").text
