"""What authenticating weights costs a shared-memory swap on the tiny default model: the learner's side
(start_update .. finish: the copy into the deployment's private shared memory, hashed as it is written)
and the server's (`receiver.open`: map the files and verify the manifest's nonce and the bytes' digest
against the handle the row names), interleaved round by round against the same path with the digest
stubbed out (a constant), medians of --repeats rounds. The difference is the digest's cost per swap;
the verified tensors then skip the engine's non-finite scan (not measured here).

    .venv/bin/python bench/weight_digest.py [--repeats 41]
"""

from __future__ import annotations

import argparse
import time
import uuid

import torch

from common import default_model, median, save  # noqa: E402


class _NoDigest:
    """The digest stubbed out: the same path without hashing."""

    def update(self, *entry) -> None:  # noqa: ANN002
        pass

    def update_many(self, entries) -> None:  # noqa: ANN001
        pass

    def hexdigest(self) -> str:
        return "0" * 64


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=41)
    args = parser.parse_args()
    torch.set_num_threads(1)
    from transformers import AutoModelForCausalLM

    from liveloop.transport import TransportConfig, make_receiver, make_sender
    from liveloop.transport import shared_memory as shm

    model_dir = default_model()
    state = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).state_dict()
    namespace = "bdig" + uuid.uuid4().hex[:8]
    config = TransportConfig(backend="shared_memory", namespace=namespace, keep_versions=1)
    sender, receiver = make_sender(config), make_receiver(config)
    digest = shm.TensorDigest
    arms: dict[str, dict[str, list[float]]] = {"sha256": {"send": [], "open": []}, "none": {"send": [], "open": []}}
    version = 0
    try:
        for _ in range(args.repeats):
            for arm, times in arms.items():
                shm.TensorDigest = digest if arm == "sha256" else _NoDigest
                version += 1
                start = time.perf_counter()
                sender.start_update(version)
                sender.send(state)
                handle = sender.finish()
                sent = time.perf_counter()
                with receiver.open(handle):
                    pass
                times["send"].append(sent - start)
                times["open"].append(time.perf_counter() - sent)
    finally:
        shm.TensorDigest = digest
        for v in shm.segments(namespace):
            shm.remove_version(namespace, v)
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    out = {arm: {k: median(v) * 1000 for k, v in times.items()} for arm, times in arms.items()}
    cost = sum(out["sha256"].values()) - sum(out["none"].values())
    for arm, ms in out.items():
        print(f"{arm:6s} send {ms['send']:6.2f} ms  open {ms['open']:6.2f} ms")
    print(f"digest per swap ({nbytes / 1e6:.2f} MB hashed by each side): {cost:.2f} ms")
    print(f"wrote {save('weight_digest', {'ms': out, 'digest_ms_per_swap': cost, 'bytes': nbytes, 'repeats': args.repeats}, model_dir)}")


if __name__ == "__main__":
    main()
