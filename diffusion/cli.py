"""`liveloop bgpo ...`: the BGPO command group (wired into liveloop/cli.py by `register` and `run`).

    liveloop bgpo build [--config bgpo]   # build the tiny diffusion default ([build]) if missing
    liveloop bgpo train [--config bgpo]   # run or resume the BGPO job ([bgpo], [sampler], [store])

`--config` is a preset name (configs/<name>.toml) or a path to a TOML file. The model paths are read
as `liveloop serve` reads them (liveloop/home.py): outside a checkout the tiny default is built in the
user's cache.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from liveloop.diffusion.config import BGPOJobConfig


def register(subparsers: argparse._SubParsersAction) -> None:
    bgpo = subparsers.add_parser("bgpo", help="offline RL of a masked diffusion LM (BGPO)")
    bgpo.set_defaults(func=run)
    sub = bgpo.add_subparsers(dest="bgpo_command", required=True)
    train = sub.add_parser("train", help="run (or resume) the BGPO job; publishes versions to the store")
    help_config = "the job's TOML: a preset name in configs/ or a path (default: %(default)s = configs/jobs/bgpo.toml)"
    train.add_argument("--config", default="bgpo", help=help_config + ": [bgpo], [sampler], [store]")
    train.add_argument("--no-progress", action="store_true", help="no progress bar")
    build = sub.add_parser("build", help="build the tiny diffusion default into [build].out_dir if missing")
    build.add_argument("--config", default="bgpo", help=help_config + ": [build]")
    build.add_argument("--no-progress", action="store_true", help="no progress bar")


def with_model_paths(job: BGPOJobConfig) -> BGPOJobConfig:
    """The job with its model paths read as `liveloop serve` reads them (liveloop.home.model_path): in a
    checkout models/liveloop-diffusion-tiny as written, elsewhere under $LIVELOOP_HOME or ~/.cache/liveloop."""
    from liveloop.home import model_path

    return dataclasses.replace(
        job,
        bgpo=dataclasses.replace(job.bgpo, model_dir=str(model_path(job.bgpo.model_dir))),
        build=dataclasses.replace(job.build, out_dir=str(model_path(job.build.out_dir))),
    )


def run(args: argparse.Namespace) -> int:
    import torch

    from liveloop.diffusion.config import load_bgpo_config

    torch.set_num_threads(1)
    job = with_model_paths(load_bgpo_config(args.config))
    if args.bgpo_command == "build":
        from liveloop.diffusion.sft import ensure_diffusion_model

        print(ensure_diffusion_model(job.build, progress=not args.no_progress))
        return 0
    if args.bgpo_command == "train":
        from liveloop.diffusion.bgpo import run_bgpo

        print(json.dumps(run_bgpo(job, progress=not args.no_progress), indent=2))
        return 0
    raise ValueError(f"unknown bgpo command {args.bgpo_command!r}")
