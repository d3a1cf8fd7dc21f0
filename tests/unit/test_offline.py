"""`liveloop offline kto` refuses what it cannot train on with a one-line error and exit code 2, before loading
trl or a model: a missing export, a model directory without config.json, an output directory that is
not empty, bad settings, and an export of another shape (no prompt/completion/label)."""

from __future__ import annotations

import json

from liveloop import cli


def test_bad_arguments_exit_2_with_one_line(tmp_path, capsys, model_dir):
    data = tmp_path / "kto.jsonl"
    data.write_text(json.dumps({"prompt": "a", "completion": "b", "label": True}) + "\n")
    raw = tmp_path / "raw.jsonl"
    raw.write_text(json.dumps({"prompt_ids": [1, 2], "response_ids": [3], "reward": 1}) + "\n")
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("taken")
    cases = [
        (["--data", str(tmp_path / "missing.parquet")], "--data"),
        (["--model", str(tmp_path)], "--model"),
        (["--out", str(full)], "--out"),
        (["--steps", "0"], "--steps"),
        (["--lr", "0"], "--lr"),
        (["--data", str(tmp_path / "kto.csv")], "--data"),
        (["--data", str(raw)], "KTO columns"),
    ]
    (tmp_path / "kto.csv").write_text("prompt,completion,label\n")
    for argv, message in cases:
        args = {"--data": str(data), "--model": str(model_dir), "--out": str(tmp_path / "out")}
        for k in range(0, len(argv), 2):
            args[argv[k]] = argv[k + 1]
        flat = [x for kv in args.items() for x in kv]
        assert cli.main(["offline", "kto", *flat]) == 2, argv
        err = capsys.readouterr().err
        last = err.strip().splitlines()[-1]  # (datasets' progress lines may come before it)
        assert last.startswith("liveloop: ") and message in last and "Traceback" not in err, (argv, err)
        assert not (tmp_path / "out").exists()
