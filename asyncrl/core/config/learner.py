"""The learner's sections of the configuration schema (`LearnerConfig` and what it holds): the weight push it
sends, its checkpoints, its metric sinks and MoE routing replay. Part of the one schema in
`asyncrl.core.config.schema`, kept apart as `data_config.py` is for the task and the reward."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from asyncrl.core.algo.config import AlgoConfig
from asyncrl.core.config.base import PinnedSection, Section
from asyncrl.core.lora.spec import UNTARGETABLE
from asyncrl.core.wire.push_contract import Transport


class WeightTransportConfig(Section):
    type: Transport = "gloo"
    """Data plane of the weight push: gloo (CPU tensors, broadcast from the learner), gloo-relay (CPU tensors
    passed on from replica to replica bucket by bucket, so the learner's link carries each push once: for
    replicas on other hosts behind links as thin as the learner's) or nccl (GPU tensors)."""
    host: str = "127.0.0.1"
    """Address receivers use to reach the learner's rendezvous store; the controller also sends the learner's
    liveness challenges there (its status service's gRPC port: the learner's seat, docs/architecture.md)."""
    store_port: int = Field(0, ge=0, le=65535)
    """Port of the learner's rendezvous store (0 = any free port)."""
    bucket_mb: float = Field(64.0, gt=0)
    """Tensors are flattened into buckets of at most this many MiB per broadcast call."""
    timeout_s: float = Field(60.0, gt=0)
    """Group formation and broadcast time-out."""
    join_timeout_s: float = Field(5.0, gt=0)
    """How long the learner waits for every receiver of a push to join before calling the push off and
    retrying without the absent ones (a replica that died after being picked must not stall the rest)."""
    in_band: bool = True
    """Order pushes that reuse a broadcast group through the learner's store: at each commit the controller
    reserves the next push's plan when every member follows the group, and the members wait in the store for
    that push and acknowledge it there: one gRPC call per push instead of four (docs/architecture.md, "Weight
    push"). False: the controller orders every push (UpdateWeights)."""
    sparse_deltas: bool = False
    """Send each bucket as the elements that changed since the last push every receiver took (4-byte index
    and value pairs), or whole where that is not smaller. Pays over thin links at RL learning rates with a
    half-precision wire (`model.dtype: bfloat16`): about 1% of a bfloat16 push changes per step at lr 1e-6
    (docs/deploy.md, "Networks"); float32 copies change almost everywhere. Costs the learner a copy of the
    pushed weights and a comparison per push, and receivers that read pushes bucket by bucket (vLLM) a copy."""


class CheckpointConfig(Section):
    """What the learner keeps of the policy it trains, under `<run_dir>/checkpoints/`."""

    save_every: int = Field(50, ge=0)
    """Save every this many steps (0 = only at the end of the run). Consumed buffer entries are acknowledged
    when the checkpoint that includes their step is complete, so a learner that dies between two saves
    trains them again from that checkpoint: nothing is lost, nothing counts twice."""
    keep_last: int = Field(3, ge=1)
    """Checkpoints kept; older ones are deleted once a newer one is complete."""
    resume_from: str = ""
    """A checkpoint directory to continue from (model, optimizer, RNG, step and version), or "latest": the
    newest complete checkpoint under `<run_dir>/checkpoints/` if there is one (a learner that restarts and
    resumes: `asyncrl up` after a learner crash, the deploy manifests). A controller ahead of the checkpoint
    goes back to it (`Controller.ResetTimeline`); `up --resume RUN_DIR` starts the controller at it instead."""
    export_hf: bool = True
    """Also write the policy as a Hugging Face checkpoint (safetensors, config, tokenizer, chat template),
    loadable by `transformers` and vLLM, in `hf/` beside the learner state."""
    background: bool = True
    """Write checkpoints on a thread of their own while training goes on: the learner stops only to copy model,
    optimizer and RNG state to host memory (its size again: about 3x the parameters' bytes with AdamW), and
    the entries a checkpoint covers are acknowledged once it is on disk. False: the learner stops for the
    whole save. On a sharded learner (`learner.world_size` > 1) every rank copies its shards and writes them on
    a thread of its own, over a gloo group apart from the training's."""


class TrackingConfig(Section):
    """Where the learner's per-step metrics go besides `<run_dir>/events/learner.jsonl` (same names)."""

    tensorboard: bool = True
    """TensorBoard event files in `<run_dir>/tensorboard/`."""
    wandb: bool = False
    """Weights & Biases (the `wandb` extra); `wandb_mode: offline` needs no account."""
    wandb_project: str = "asyncrl"
    """W&B project."""
    wandb_mode: Literal["online", "offline"] = "offline"
    """W&B mode; offline runs can be synced later with `wandb sync`."""


class RoutingReplayConfig(Section):
    """MoE routing replay in the learner's forwards (R2 / R3 of the routing-replay literature)."""

    mode: Literal["none", "r2", "r3"] = "none"
    """none: the learner routes on its own. r3: every learner forward (proximal and training) uses the experts
    the rollout engine routed each token to (needs rollout.engine.capture_routing). r2: the routing of the
    step's proximal forward (the weights at the start of the step) is forced on every training mini-batch, so
    later mini-batches route as the first did. Gate weights always come from the current router logits over
    the forced experts, so the router keeps learning. Needs a MoE policy and (r2) a proximal forward."""
    measure_unreplayed: bool = False
    """r3 only: one more no-grad forward per step without replay, for `routing/delta_abs_unreplayed` (what
    |logp_prox - logp_behav| would be without replay)."""


class LoraConfig(Section):
    """LoRA (peft): train low-rank adapters on the frozen base policy and push only the adapters
    (docs/lora.md)."""

    enabled: bool = False
    """Train adapters instead of every weight: optimizer state and pushes shrink to the adapters' size, the KL
    reference is the base itself (no copy), checkpoints hold the adapter (peft format) and a merged export."""
    rank: int = Field(16, ge=1, le=4096)
    """r: the adapters' rank."""
    alpha: float = Field(32.0, gt=0)
    """lora_alpha: the update is scaled by alpha / rank."""
    dropout: float = Field(0.0, ge=0, lt=1)
    """Dropout on the adapters' input while training (the proximal and reference forwards run without it)."""
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    """Linear modules that get an adapter: every module whose name ends with one of these (peft's rule). Not the
    embeddings or the output projection (tied to the embeddings in many models)."""

    @model_validator(mode="after")
    def _check_targets(self) -> LoraConfig:
        if not self.target_modules:
            raise ValueError("learner.lora.target_modules: name at least one module")
        for name in self.target_modules:
            if name.rsplit(".", 1)[-1] in UNTARGETABLE:
                raise ValueError(f"learner.lora.target_modules: {name!r} cannot carry an adapter (embeddings "
                                 "and the output projection are not targeted)")
        return self


class LearnerConfig(PinnedSection):
    host: str = "127.0.0.1"
    """Interface the learner's status service binds."""
    port: int = Field(0, ge=0, le=65535)
    """gRPC port of the learner's status service (0 = any free port)."""
    metrics_port: int = Field(0, ge=0, le=65535)
    """Prometheus /metrics port (0 = any free port)."""
    batch_size: int = Field(64, ge=1)
    """B: trajectories per learner step (a multiple of sampling.group_size)."""
    minibatches: int = Field(1, ge=1)
    """Optimizer steps per learner step (B is split into this many mini-batches)."""
    total_steps: int = Field(40, ge=0)
    """Learner steps before the run ends."""
    lr: float = Field(1e-4, gt=0)
    """AdamW learning rate."""
    weight_decay: float = Field(0.0, ge=0)
    """AdamW weight decay."""
    max_grad_norm: float = Field(1.0, gt=0)
    """Gradient clipping norm."""
    device: str = "cpu"
    """torch device of the learner ("cuda" with world_size > 1: each rank its local GPU)."""
    world_size: int = Field(1, ge=1)
    """Ranks of the learner (processes, one GPU each on GPUs): the policy is sharded over them with FSDP2 and
    each trains its share of every batch. `asyncrl learner` starts them with torchrun on this host; rank 0
    talks to the controller and pushes the weights."""
    microbatch_tokens: int = Field(0, ge=0)
    """Token budget of one forward/backward: each mini-batch is cut into micro-batches of at most this many
    tokens (prompt + response) and their gradients accumulated, so batch size and memory are independent
    (0 = a mini-batch at once)."""
    mixed_precision: Literal["none", "bf16"] = "none"
    """With world_size > 1: "bf16" computes forwards and backwards in bfloat16 over float32 weights and
    float32 gradient reduction (GPUs); "none" keeps the model's dtype (CPUs: float32)."""
    share_prompts: bool = True
    """Forward each distinct prompt of a (micro-)batch once (`asyncrl.core.model.prompt_sharing`), in the layout that
    costs least for the batch: each group's prompt and responses packed into one row under a block mask (no
    padding between responses; needs sdpa or eager attention and full attention in every layer), or the
    prompts' KV cache copied to the rows of their group (needs an attention-only model and no activation
    checkpointing). The same log-probs and gradients as one forward per whole sequence (a model with dropout
    on draws one mask for a group's prompt), for about distinct prompts + B x response tokens instead of
    B x (prompt + response). Applies to a dense policy on one learner rank (an MoE policy's routing is
    captured and replayed per sequence position, FSDP2 brackets one forward per call); there, where neither
    layout runs, or when false, every sequence runs whole (the learner's log says why)."""
    activation_checkpointing: bool = False
    """Recompute each transformer block's activations in the backward instead of keeping them (less memory,
    about a third more compute)."""
    threads: int = Field(1, ge=0)
    """torch intra-op threads (0 = torch default)."""
    eval_every: int = Field(10, ge=0)
    """Greedy-accuracy evaluation on the held-out set every this many steps (0 = only first and last)."""
    eval_prompts: int = Field(0, ge=0)
    """Each evaluation uses the first this many held-out prompts (0 = all of them): a cheaper figure on a large
    held-out set, the same prompts every time."""
    eval_pass_k: int = Field(0, ge=0)
    """Also estimate pass@k on the held-out set with `eval_samples` samples per prompt (0 = off)."""
    eval_samples: int = Field(8, ge=1)
    """Samples per held-out prompt for pass@k (n >= k)."""
    eval_samples_max: int = Field(0, ge=0)
    """Dynamic N for pass@k: a held-out prompt none of whose `eval_samples` samples solved it gets
    `eval_samples` more at a time, up to this many in all (0 = off). The hard prompts decide pass@k at large k;
    the easy ones are settled by a few samples. Read the Beta-binomial figure then: its likelihood is the same
    whatever rule decided how many samples a prompt got, while the per-prompt "unbiased" estimate is unbiased
    for a fixed N only (sampling on after a miss raises it)."""
    eval_pass_k_large: int = Field(0, ge=0)
    """Also extrapolate pass@k to this larger k (checkpoint selection), with the Bernoulli formula 1 - (1 - c/n)^k
    per prompt and with a Beta-binomial fit of the pass rates across prompts (0 = off; needs `eval_pass_k`)."""
    eval_by: Literal["learner", "replica"] = "learner"
    """Who runs the evaluations every `eval_every` steps. "learner": its own model, in line (training waits).
    "replica": a live rollout replica holding the newest weights, through its Generate RPC, while training
    goes on; that replica's rollouts wait meanwhile, a push may land mid-evaluation (the `eval` event records
    the versions its tokens came from), an evaluation still running at the next one's step skips that one,
    and one the replicas cannot run (none live, an error) runs on the learner instead. The first and the last
    evaluation always run on the learner. Greedy accuracy only (`eval_pass_k` needs the learner)."""
    eval_timeout_s: float = Field(300.0, gt=0)
    """With `eval_by: replica`: the deadline of each call an evaluation makes (the controller's status, each
    Generate of at most `rollout.engine.max_batch_size` prompts)."""
    checkpoint: CheckpointConfig = CheckpointConfig()
    """Saving the trained policy and the learner state."""
    max_restarts: int = Field(2, ge=0)
    """`asyncrl up` restarts a learner that dies, at most this many times (0: a dead learner ends the run): it
    resumes from its latest checkpoint (the base model when there is none yet) and takes the run back there
    (`Controller.ResetTimeline`; the lost steps are trained again). In a deployment of several runs, also how
    many times a run whose loop fails is restarted the same way inside the learner process, alone."""
    prefetch: bool = True
    """Read the next batch's entries from the buffer, run the checks that need nothing but the entry and
    assemble the batch on a thread while the current batch trains and its weights are pushed (what depends on
    the learner's state, such as its current version and the groups it trained, is checked, and an entry
    dead-lettered if it must be, when its batch is collected)."""
    oldest_first: bool = True
    """With a bounded controller.eta: read every group waiting in the buffer (at most (η + 1) · B trajectories
    are admitted ahead of the learner) and train the oldest first (by their oldest token's version, then
    prompt index) instead of in the order they were written. A group a replica finished late then no longer
    waits behind the newer groups written before it and stays within η at training, unless it was written
    only after its last admissible step began (bench/consumption_staleness.py, the demo: trajectories older
    than η 1.0% -> 0 at η = 4, 0.33% -> 0.25% at η = 2, wall time per step unchanged). false, or η 0 or null:
    the order they were written."""
    stale_groups: Literal["drop", "hold", "train"] = "drop"
    """A group the learner reads whose oldest token is more than controller.eta versions older than the weights
    that would train it (written late, after the step it was admitted for began: a slow replica, a long
    episode; admission alone cannot keep it out). drop: dead-lettered with that reason, its trajectories'
    quota given back to the controller (`ReturnQuota`) so fresh ones are admitted in their place, and its
    prompt generated again by the next lease granted; nothing trained is ever older than η, which the audit
    checks. hold: before each step the learner waits until every lease that would otherwise fall behind η at
    the next step has ended (`AwaitLeases`), then trains those groups oldest first, so none is lost and none
    is stale; it gives back some of the asynchronous speed-up, waiting for the slowest episodes (a group stale
    all the same, written after its lease expired, is dropped as under drop). train: trained anyway (the audit
    counts it). drop is the default: it keeps the most of the speed-up (4.8x against hold's 3.7x on the agent
    demo with heavy-tailed tools, where it dropped a tenth of the groups written and generated their prompts
    again; bench/agentic_speedup.py, docs/agents.md). Without a bound (η null) every group is trained."""
    push_in_background: bool = True
    """Push each step's weights from a snapshot on a background thread while the next step trains (the push
    leaves the learner's critical path; the next push, a checkpoint and the end of the run wait for it).
    false: every step waits for its push to commit."""
    memory_check: bool = True
    """Before training, add up the host memory the settings will hold (weights, gradients, AdamW, the KL
    reference, the background push's snapshot, the background checkpoint's copy) and compare it with what the
    machine or container has left: where it does not fit, give up the background checkpoint, then the
    background push (each named in a warning), else refuse to start naming the figures (a CPU learner on one
    rank; docs/architecture.md "Memory"). false: start whatever the plan says."""
    batch_timeout_s: float = Field(600.0, gt=0)
    """Give up (error) when no full batch arrives within this time."""
    status_interval_s: float = Field(0.25, ge=0, le=60)
    """Least time between two of the progress reports the learner sends after its steps (its
    `LearnerHeartbeat`: the status page and `GetStatus`; the buffer gauges on its /metrics). A step that ends
    sooner after the last report is reported once the interval is up, with the newest figures then (a step
    skipped is summed up by them): the page is never more than an interval behind, and the last step is always
    reported. Each report costs CPU in the learner (about 1 ms on the demo), the controller and Redis, on the
    cores training shares with generation; at 20 steps per second, one per step is 20 RPCs a second that tell
    a reader nothing more. 0: after every step (one report on its way at a time)."""
    weight_transport: WeightTransportConfig = WeightTransportConfig()
    """How new weights reach the replicas."""
    algo: AlgoConfig = AlgoConfig()
    """Objective: policy loss, rollout correction, advantages, KL, OPD, shaping."""
    routing_replay: RoutingReplayConfig = RoutingReplayConfig()
    """MoE routing replay (none, r2, r3)."""
    lora: LoraConfig = LoraConfig()
    """Train LoRA adapters instead of full weights."""

    @model_validator(mode="after")
    def _check_parts(self) -> LearnerConfig:
        in_parts = self.world_size > 1 or self.microbatch_tokens > 0
        if in_parts and self.algo.bypass:
            raise ValueError(
                "learner.world_size / learner.microbatch_tokens: a mini-batch trained in parts needs its loss "
                "denominator before the forward; the bypass objective rejects on the current policy: use a "
                "decoupled preset")
        if self.world_size > 1 and self.routing_replay.mode != "none":
            raise ValueError("learner.routing_replay.mode: routing replay runs on one learner rank "
                             "(learner.world_size: 1)")
        if self.world_size > 1 and self.algo.kl.mode != "none":
            raise ValueError("learner.algo.kl.mode: the KL reference model is kept on one learner rank "
                             "(learner.world_size: 1)")
        if self.eval_by == "replica" and self.eval_pass_k:
            raise ValueError("learner.eval_by: replica evaluates greedy accuracy only; learner.eval_pass_k needs "
                             "the learner's own sampling (eval_by: learner, or eval_pass_k: 0)")
        if self.mixed_precision != "none" and self.world_size == 1:
            raise ValueError("learner.mixed_precision: applies to the sharded learner (learner.world_size > 1)")
        if self.mixed_precision != "none" and not self.device.startswith("cuda"):
            raise ValueError(f"learner.mixed_precision: {self.mixed_precision} needs learner.device cuda")
        return self
