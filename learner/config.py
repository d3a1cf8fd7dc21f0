"""The learner's configuration section (`[learner]`); the critic has its own (`[critic]`), and which
adapters it trains is `[segments]`'s, shared with the server (liveloop/segments.py)."""

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from liveloop.config_types import ConfigError, check_literals

if TYPE_CHECKING:
    from liveloop.segments import SegmentsConfig


@dataclass(frozen=True)
class SlidingWindowConfig:
    """`[learner.sliding_window]`: the no-critic baseline."""

    window: int = field(default=256, metadata={"help": "W, rewards in the baseline's window"})

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValueError("window must be >= 1")


@dataclass(frozen=True)
class GRPOConfig:
    """`[learner.grpo]`: the group baselines (`grpo`, and `grpo_dis` with SAO's mask instead of the clip)."""

    group_size: int = field(default=4, metadata={"help": "G, rated responses per prompt per step"})
    clip_eps: float = field(default=0.2, metadata={"help": "grpo: PPO clip epsilon"})

    def __post_init__(self) -> None:
        if self.group_size < 2 or not (0 < self.clip_eps < 1):
            raise ValueError("group_size must be >= 2 and clip_eps in (0, 1)")


@dataclass(frozen=True)
class LoraSettings:
    """`[learner.lora]`: the LoRA adapters trained when `[segments] adapters` is "segment" or "shared"."""

    rank: int = field(default=8, metadata={"help": "r, the adapter's rank"})
    alpha: float = field(default=16.0, metadata={"help": "LoRA alpha (the update is scaled by alpha / r)"})
    target_modules: tuple[str, ...] = field(
        default=("q_proj", "k_proj", "v_proj", "o_proj"),
        metadata={"help": "module names the adapter wraps: Linear layers (the attention projections: what vLLM's "
                  "LoRA serves too; lm_head the hf engine serves, vLLM not)"},
    )
    target_parameters: tuple[str, ...] = field(
        default=(),
        metadata={"help": "parameter names the adapter wraps through peft's target_parameters, e.g. "
                  "\"mlp.experts.gate_up_proj\", \"mlp.experts.down_proj\" (a MoE model's fused experts: 2-D or 3-D "
                  "parameters, not Linear layers); the hf engine serves them, vLLM refuses them"},
    )
    max_learning_rate: float = field(
        default=0.0,
        metadata={"help": "an adapter's own ceiling for the adaptive learning rate (0: [learner] max_learning_rate): "
                  "a fresh adapter (B = 0) moves the policy far less per unit of rate than the whole policy does"},
    )

    restart_window: int = field(
        default=0,
        metadata={"help": "start a lane's adapter over (back to the base) when the mean reward of its last "
                  "restart_window trained ratings falls restart_drop below the best such mean since it started "
                  "(0: never): its users moved away from what it learned (learner/restart.py)"},
    )
    restart_drop: float = field(default=0.5, metadata={"help": "the fall in that mean reward that starts the adapter over"})
    restart_critic: bool = field(
        default=False,
        metadata={"help": "a restart sends the lane's critic back to its start too (version 0's: pre-trained, else "
                  "cold), not only the adapter (measured worse on the drift rig, seed 0: not shipped)"},
    )

    def __post_init__(self) -> None:
        if self.rank < 1 or self.alpha <= 0 or not (self.target_modules or self.target_parameters):
            raise ValueError("lora rank must be >= 1, alpha > 0, and target_modules or target_parameters non-empty")
        names = [*self.target_modules, *self.target_parameters]
        if not all(isinstance(n, str) and n.strip() == n and n for n in names) or len(set(names)) != len(names):
            raise ValueError(f"lora target_modules and target_parameters must be distinct non-empty names: {names}")
        if self.max_learning_rate < 0:
            raise ValueError("lora max_learning_rate must be >= 0 (0: the learner's)")
        if self.restart_window < 0 or not 0 < self.restart_drop <= 1:
            raise ValueError("lora restart_window must be >= 0 (0: off) and restart_drop in (0, 1]")
        if any("." not in n for n in self.target_parameters):
            raise ValueError(
                f"lora target_parameters {list(self.target_parameters)} must each be <module>.<parameter> "
                "(e.g. \"mlp.experts.gate_up_proj\")"
            )


@dataclass(frozen=True)
class LearnerConfig:
    enabled: bool = field(default=True, metadata={"help": "`liveloop serve` starts the online learner"})
    cursor_name: str = field(default="sao", metadata={"help": "which learner_cursor row this learner owns"})
    batch_size: int = field(default=1, metadata={"help": "B: rated responses per policy step, in arrival order"})
    max_batch_size: int = field(
        default=0,
        metadata={"help": "adaptive batching: when more than B ratings wait, one step takes up to this many (each its "
                  "own single rollout with its own critic advantage; no grouping, no waiting); 0 = B"},
    )
    device: Literal["auto", "cpu", "cuda"] = field(
        default="auto", metadata={"help": "where the policy, critic and KL reference train: auto = cuda when present"}
    )
    dtype: Literal["auto", "float32", "bfloat16"] = field(
        default="auto", metadata={"help": "their weights' dtype: auto = bfloat16 on a GPU, float32 on the CPU"}
    )
    master_weights: bool = field(
        default=True,
        metadata={"help": "with bfloat16 weights, step an fp32 copy with fp32 Adam moments (mixed precision); "
                  "false: the optimizer keeps bfloat16 state"},
    )
    gradient_checkpointing: bool = field(
        default=False, metadata={"help": "recompute activations in the backward pass (long responses, big models)"}
    )
    recompute_over_tokens: int = field(
        default=0,
        metadata={"help": "recompute activations in the backward only for a batch of more tokens than this (rows x padded "
                  "length; learner/recompute.py): a long episode's or a big batch's step stays within memory, a short "
                  "chat's keeps its speed (0: only as gradient_checkpointing says)"},
    )
    publish_every_steps: int = field(default=4, metadata={"help": "N: publish a version every N policy steps"})
    publish_every_seconds: float = field(default=5.0, metadata={"help": "T: or after T seconds with any step"})
    coalesce_versions: bool = field(
        default=False,
        metadata={"help": "when a publish is due but the next rating is already waiting (ratings come faster than steps), "
                  "train it first: the next step's version supersedes this one (learner/superseded_versions); a version "
                  "still follows at least every T seconds, and as soon as nothing more waits"},
    )
    poll_seconds: float = field(default=0.1, metadata={"help": "how often to look for new ratings"})
    learning_rate: float = field(default=2e-4, metadata={"help": "policy AdamW learning rate"})
    eps_low: float = field(default=0.3, metadata={"help": "two-sided mask: keep ratio > 1 - eps_low"})
    eps_high: float = field(default=5.0, metadata={"help": "two-sided mask: keep ratio < 1 + eps_high"})
    gamma: float = field(default=1.0, metadata={"help": "discount"})
    lambda_value: float = field(default=1.0, metadata={"help": "GAE lambda for the value targets"})
    lambda_alpha: float = field(default=0.05, metadata={"help": "policy lambda = 1 - 1/(alpha * L)"})
    kl_coef: float = field(default=0.0, metadata={"help": "anchor to the base policy (KL), 0 = off"})
    kl_estimator: Literal["k3", "exact"] = field(
        default="k3",
        metadata={"help": "k3: on the sampled tokens (its pull saturates at 1 per token); exact: over the vocabulary at each position"},
    )
    target_kl_to_base: float = field(
        default=0.0,
        metadata={"help": "adapt kl_coef (its starting value) so the KL to the base tracks this (nats per token; "
                  "0 = kl_coef stays fixed; kl_coef = 0 keeps the anchor off)"},
    )
    kl_horizon: int = field(default=200, metadata={"help": "adaptive kl_coef: samples over which it may move by 20%"})
    target_step_kl: float = field(
        default=0.0,
        metadata={"help": "adapt the learning rate so each update moves the policy by about this KL on its tokens "
                  "(nats per token; 0 = learning_rate stays fixed)"},
    )
    max_step_kl: float = field(
        default=0.0,
        metadata={"help": "trust region: an update that moves the policy by more KL than this on its tokens is cut back "
                  "to 1/2, 1/10 or 1/100 of it, or undone (rl/control.py trust_region; nats per token; 0 = off; zero_stage 0 only)"},
    )
    min_learning_rate: float = field(default=1e-6, metadata={"help": "the adaptive learning rate's floor"})
    max_learning_rate: float = field(default=1e-2, metadata={"help": "the adaptive learning rate's ceiling"})
    diagnostics_window: int = field(
        default=64, metadata={"help": "samples over which the critic's value error and the advantage balance are reported"}
    )
    max_grad_norm: float = field(default=1.0, metadata={"help": "policy gradient clipping"})
    checkpoint_dir: str = field(default="data/versions", metadata={"help": "where published versions are saved"})
    seed: int = field(default=0, metadata={"help": "torch seed of the learner process"})
    method: Literal["sao", "sliding_window", "grpo", "grpo_dis"] = field(
        default="sao",
        metadata={"help": "sao | sliding_window | grpo | grpo_dis (baselines for comparisons, see learner/methods.py)"},
    )
    sliding_window: SlidingWindowConfig = field(
        default_factory=SlidingWindowConfig, metadata={"help": "[learner.sliding_window]: that baseline's knobs"}
    )
    grpo: GRPOConfig = field(default_factory=GRPOConfig, metadata={"help": "[learner.grpo]: the group baselines' knobs"})
    keep_last_versions: int = field(
        default=8, metadata={"help": "checkpoint retention: keep the newest N published versions' checkpoints"}
    )
    keep_parent_chain: int = field(
        default=4, metadata={"help": "checkpoint retention: keep the serving version's parent chain up to K back"}
    )
    max_per_key_per_batch: int = field(
        default=1, metadata={"help": "influence cap: most ratings from one API key in one policy step"}
    )
    lone_key_batches: bool = field(
        default=False,
        metadata={"help": "influence cap: max_per_key_per_batch binds only while another key's rating waits; a key whose "
                  "ratings are the only ones waiting fills the step (one user, or an app rating through one key, trains "
                  "in batches too)"},
    )
    max_per_key_per_window: int = field(
        default=0, metadata={"help": "influence cap: most trained ratings from one API key per window (0 = no cap)"}
    )
    influence_window_seconds: float = field(default=3600.0, metadata={"help": "the influence cap's window"})
    episode_credit: Literal["all", "last"] = field(
        default="all", metadata={"help": "all: a rating trains every turn of its episode (learner/episodes.py); last: the rated turn alone (an ablation)"}
    )
    episode_observations: Literal["skip", "actions"] = field(
        default="skip", metadata={"help": "skip: observation tokens are out of the loss and the GAE (SAO); actions: trained as if sampled (an ablation)"}
    )
    max_episode_tokens: int = field(
        default=16384, metadata={"help": "an episode (or a response) longer than this, prompt included, is not trained "
                                 "(counted in learner/episodes_skipped_too_long); 0 = no bound"}
    )
    zero_stage: int = field(
        default=0, metadata={"help": "0: plain torch AdamW; 1-3: DeepSpeed ZeRO for the policy and critic optimizers"}
    )
    ranks: int = field(
        default=1,
        metadata={"help": "N: ranks of the policy step (data parallel, DeepSpeed ZeRO, gloo on this machine's CPU; "
                  "learner/ranks.py); N > 1 needs zero_stage 1-3, device cpu and batch_size >= N; the critic then "
                  "trains on rank 0 with plain AdamW"},
    )
    lora: LoraSettings = field(
        default_factory=LoraSettings, metadata={"help": "[learner.lora]: the adapters' shape (which adapters: [segments])"}
    )
    advantage_norm: Literal["none", "running"] = field(
        default="none",
        metadata={"help": "sao only: running = divide each sample's advantages by the running RMS of recent action-token "
                  "advantages (rl/advantages.py normalize_by_running_rms; per learner or lane; off pending the sweep)"},
    )
    advantage_norm_horizon: int = field(
        default=100, metadata={"help": "advantage_norm running: samples the RMS averages over (plain mean up to this many, then an EMA)"}
    )
    advantage_norm_floor: float = field(
        default=0.05, metadata={"help": "advantage_norm running: the scale never goes below this (at most 1/floor amplification)"}
    )
    baseline: Literal["critic", "running_mean"] = field(
        default="critic",
        metadata={"help": "sao only: what GAE subtracts. critic: its values; running_mean: every token's value is the "
                  "running mean of this learner's (lane's) earlier rewards, the critic still trains (off pending the sweep)"},
    )
    baseline_horizon: int = field(
        default=100, metadata={"help": "baseline running_mean: rewards it averages over (plain mean up to this many, then an EMA)"}
    )

    @property
    def adapter_max_learning_rate(self) -> float:
        """The adaptive learning rate's ceiling for an adapter's lane (`[learner.lora]`'s, else the learner's)."""
        return self.lora.max_learning_rate or self.max_learning_rate

    @property
    def largest_batch(self) -> int:
        """The most ratings one step takes (`max_batch_size`, or B when adaptive batching is off)."""
        return self.max_batch_size or self.batch_size

    def __post_init__(self) -> None:
        check_literals(self)
        if min(self.target_kl_to_base, self.target_step_kl) < 0 or self.kl_horizon < 1 or self.diagnostics_window < 2:
            raise ValueError("target_kl_to_base and target_step_kl must be >= 0, kl_horizon >= 1, diagnostics_window >= 2")
        if self.max_step_kl < 0 or (self.max_step_kl > 0 and self.zero_stage != 0):
            raise ValueError("max_step_kl must be >= 0, and the trust region needs zero_stage 0 (whole parameters in this process)")
        if not (0 < self.min_learning_rate <= self.learning_rate <= self.max_learning_rate):
            raise ValueError("need 0 < min_learning_rate <= learning_rate <= max_learning_rate")
        if 0 < self.lora.max_learning_rate < self.learning_rate:
            raise ValueError("lora.max_learning_rate must be 0 (the learner's) or >= learning_rate")
        if self.batch_size < 1 or self.publish_every_steps < 1 or self.recompute_over_tokens < 0:
            raise ValueError("batch_size and publish_every_steps must be >= 1, recompute_over_tokens >= 0 (0: off)")
        if self.max_batch_size and self.max_batch_size < self.batch_size:
            raise ValueError("max_batch_size must be 0 (= batch_size) or >= batch_size")
        if self.zero_stage != 0 and self.max_batch_size not in (0, self.batch_size):
            raise ValueError("adaptive batching needs zero_stage 0 (DeepSpeed fixes its batch size at start)")
        if self.zero_stage != 0 and self.dtype == "bfloat16":
            raise ValueError("bfloat16 learner weights need zero_stage 0 (DeepSpeed's own bf16 mode is not wired)")
        if self.zero_stage not in (0, 1, 2, 3):
            raise ValueError("zero_stage must be 0 (plain torch), 1, 2 or 3")
        if self.ranks < 1 or (self.ranks > 1 and self.zero_stage == 0):
            raise ValueError("ranks must be >= 1, and ranks > 1 needs zero_stage 1, 2 or 3 (DeepSpeed runs the ranks)")
        if self.ranks > 1 and (self.device == "cuda" or self.batch_size < self.ranks):
            raise ValueError("ranks > 1 needs device 'cpu' or 'auto' (gloo on the CPU) and batch_size >= ranks (a rating per rank)")
        if self.keep_last_versions < 1 or self.keep_parent_chain < 0:
            raise ValueError("keep_last_versions must be >= 1 and keep_parent_chain >= 0")
        if self.max_episode_tokens < 0:
            raise ValueError("max_episode_tokens must be >= 0 (0: no bound)")
        if self.max_per_key_per_batch < 1 or self.max_per_key_per_window < 0 or self.influence_window_seconds <= 0:
            raise ValueError("max_per_key_per_batch must be >= 1, max_per_key_per_window >= 0, influence_window_seconds > 0")
        if not (0 < self.eps_low < 1) or self.eps_high <= 0:
            raise ValueError("eps_low must be in (0, 1) and eps_high > 0")
        if self.method != "sao" and (self.advantage_norm != "none" or self.baseline != "critic"):
            raise ValueError(
                f"advantage_norm and baseline are SAO's levers; method {self.method!r} needs advantage_norm 'none' "
                "and baseline 'critic' (the baselines keep their published advantages)"
            )
        if self.advantage_norm_horizon < 1 or self.baseline_horizon < 1 or self.advantage_norm_floor <= 0:
            raise ValueError("advantage_norm_horizon and baseline_horizon must be >= 1, advantage_norm_floor > 0")


def check_adapters(learner: "LearnerConfig", segments: "SegmentsConfig") -> None:
    """Adapters (`[segments] adapters` other than "none") train with zero_stage 0 only: a ConfigError
    otherwise (the adapters are small; the frozen base is not optimised)."""
    if segments.adapters != "none" and learner.zero_stage != 0:
        raise ConfigError(f"segments.adapters = {segments.adapters!r} needs learner.zero_stage 0 (the adapters are small; "
                          "the frozen base is not optimised)")
