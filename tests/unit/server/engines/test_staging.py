"""Staging a swap's weights, before the swap reaches the model: values not known finite are scanned
there (off the engine's worker and before vLLM is paused; vLLM's checkpoints are read into memory
there too), a `verified` source (the transport checked its digest) is not scanned again, and the
worker's own check is names and shapes only."""

from __future__ import annotations

import pytest
import torch

from liveloop.server.config import EngineConfig
from liveloop.transport.weights import CheckpointDir, NamedTensors
from liveloop.server.engines.hf.engine import HFEngine
from liveloop.server.engines.vllm.engine import VLLMEngine
from liveloop.server.engines.vllm.worker import SHM_ROOT, SharedWeights
from liveloop.transport.weights import WeightsRejected, check_state, copy_state

NAN = {"w": torch.tensor([1.0, float("nan")])}


def test_the_hf_engine_scans_unverified_tensors_while_staging():
    engine = HFEngine(EngineConfig(backend="hf"), "unused")  # staging needs no model
    with pytest.raises(WeightsRejected, match="non-finite values in w"):
        engine._stage(NamedTensors(NAN))
    staged = engine._stage(NamedTensors({"w": torch.ones(2)}))
    assert isinstance(staged, NamedTensors) and staged.verified
    trusted = NamedTensors(NAN, verified=True)
    assert engine._stage(trusted) is trusted  # not scanned again


def test_the_vllm_engine_refuses_non_finite_tensors_before_packing_them():
    engine = VLLMEngine(EngineConfig(backend="vllm"), "unused")
    before = set(SHM_ROOT.glob("liveloop-weights-*"))
    with pytest.raises(WeightsRejected, match="non-finite values in w"):
        engine._stage(NamedTensors(NAN))
    assert set(SHM_ROOT.glob("liveloop-weights-*")) == before  # nothing was packed
    packed = engine._stage(NamedTensors(NAN, verified=True))  # verified: packed as given, no scan
    try:
        assert isinstance(packed, SharedWeights) and [e.name for e in packed.entries] == ["w"]
    finally:
        packed.release()


def test_the_vllm_engine_reads_and_checks_a_checkpoint_one_tensor_at_a_time(tmp_path):
    from safetensors.torch import save_file

    from liveloop.server.engines.vllm.worker import read_shared

    engine = VLLMEngine(EngineConfig(backend="vllm"), "unused")
    save_file({"a": torch.arange(6, dtype=torch.float32).view(2, 3), "b": torch.tensor([1, 2])}, str(tmp_path / "model.safetensors"))
    packed = engine._stage(CheckpointDir(tmp_path))
    try:
        with read_shared(packed.wire()) as views:
            got = dict(views)
            assert torch.equal(got["a"], torch.arange(6, dtype=torch.float32).view(2, 3)) and torch.equal(got["b"], torch.tensor([1, 2]))
            del got
    finally:
        packed.release()
    save_file({"a": torch.ones(2), "b": torch.tensor([float("inf")])}, str(tmp_path / "model.safetensors"))
    before = set(SHM_ROOT.glob("liveloop-weights-*"))
    with pytest.raises(WeightsRejected, match="non-finite values in b"):
        engine._stage(CheckpointDir(tmp_path))
    assert set(SHM_ROOT.glob("liveloop-weights-*")) == before  # the half-written file is gone
    with pytest.raises(WeightsRejected, match="no \\*.safetensors checkpoint"):
        engine._stage(CheckpointDir(tmp_path / "no-such-checkpoint"))


def test_the_worker_check_is_names_and_shapes_and_copies_in_place():
    m = torch.nn.Linear(2, 2, bias=False)
    with pytest.raises(WeightsRejected, match=r"weight has shape \(2, 3\), the model's is \(2, 2\)"):
        check_state(m, {"weight": torch.zeros(2, 3)}, finite=False)
    nan = {"weight": torch.full((2, 2), float("nan"))}
    check_state(m, nan, finite=False)  # known finite: not scanned
    with pytest.raises(WeightsRejected, match="non-finite"):
        check_state(m, nan)
    weight = m.weight
    copy_state(m, {"weight": torch.full((2, 2), 3, dtype=torch.float64)})  # cast into the same tensor
    assert m.weight is weight and torch.equal(m.weight, torch.full((2, 2), 3.0))
