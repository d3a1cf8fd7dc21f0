"""Which segment adapter lineages the release gate runs (`gated_segments`, and `wants_gate` at start):
a segment takes `[release] mode` unless `[release] segments` overrides it; a gated segment needs the
hf engine's adapter slots, so vLLM (slots not verified on a GPU yet) refuses it at start with a
ConfigError that names the segment and the way out."""

from __future__ import annotations

import pytest

from liveloop.config import ConfigError, load_config
from liveloop.release.config import ReleaseConfig
from liveloop.segments import lanes
from liveloop.server.control.gate import gated_segments, wants_gate as wants_gate_of

def wants_gate(config) -> bool:
    return wants_gate_of(config.release, lanes(config.segments), config.engine.backend)


LEARNER = '[segments]\nadapters = "segment"\nnames = ["cozy", "night"]\n'


def test_segments_take_the_base_mode_unless_overridden():
    assert gated_segments(ReleaseConfig(mode="canary"), ("cozy", "night"), "hf") == ("cozy", "night")
    assert gated_segments(ReleaseConfig(mode="canary", segments={"night": "immediate"}), ("cozy", "night"), "hf") == ("cozy",)
    assert gated_segments(ReleaseConfig(segments={"night": "gated"}), ("cozy", "night"), "hf") == ("night",)
    assert gated_segments(ReleaseConfig(), ("cozy", "night"), "vllm") == ()  # all immediate: nothing to refuse


def test_vllm_refuses_a_gated_segment_naming_it_and_the_way_out():
    with pytest.raises(ConfigError, match=r"cozy = 'gated'.*engine.backend = 'vllm'.*segments = \{ cozy = \"immediate\" \}"):
        gated_segments(ReleaseConfig(segments={"cozy": "gated"}), ("cozy", "night"), "vllm")


def test_wants_gate_for_a_gated_segment_on_hf_and_refuses_it_on_vllm():
    hf = load_config(text=LEARNER + '[engine]\nbackend = "hf"\n[release]\nsegments = { cozy = "canary" }\n')
    assert wants_gate(hf)  # the base lineage is immediate: the gate runs for cozy alone
    assert not wants_gate(load_config(text=LEARNER + '[engine]\nbackend = "hf"\n'))
    vllm = load_config(text=LEARNER + '[engine]\nbackend = "vllm"\n[release]\nsegments = { cozy = "canary" }\n')
    with pytest.raises(ConfigError, match="adapter slot"):
        wants_gate(vllm)


def test_a_gated_segment_name_may_not_hold_the_slot_marker():
    with pytest.raises(ConfigError, match="@candidate"):
        gated_segments(ReleaseConfig(mode="gated"), ("a@candidate",), "hf")
