"""Packed rows: a group's prompt and its G responses laid out one after another in one row of the batch, each
response attending to its prompt and to itself only (a block mask), so that a forward computes neither a
prompt twice nor any padding between short responses.

A *tree* is one prompt followed by some of its responses; a row holds one or more trees, and a group whose
tree would be longer than a row's cap is cut into several trees, each with its own copy of the prompt.
Positions restart at each response (prompt 0..P-1, every response P, P+1, ...), so each token sees exactly
what it sees in its whole sequence: the log-probs and gradients equal one forward of every whole sequence
(`modeling.sequence_logprobs`) to float rounding.

A response's last token predicts nothing the caller asks for, so it is left out of the row: its log-prob comes
from the hidden state one position earlier, like every other token's.

The plan is chosen by cost, in units of one token's linear layers: the tokens of the rows (padding included)
plus each attended pair at `pair_cost` (`prompt_sharing.choose_layout` holds this against the other layouts).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import torch

from asyncrl.core.model.modeling import check_response_starts, distinct_prompts, padded_rows, token_logprobs
from asyncrl.core.model.sampling import SamplingParams

PACKABLE_ATTENTION = frozenset({"sdpa", "eager"})
"""Attention implementations that take an arbitrary 4D mask (as a boolean for sdpa, additive for eager)."""

MORE_ROWS_TRIED = 8
"""Row counts the plan tries beyond the fewest that fit: more rows are shorter, and attention grows with the
square of a row's length."""

Tree = tuple[int, list[int]]
"""A prompt (its index among the distinct prompts) and the sequences whose responses follow it in a row."""


def model_width(model) -> int:
    """The model's hidden size (a multimodal config's text part)."""
    config = model.config
    config = getattr(config, "text_config", None) or config
    return int(getattr(config, "hidden_size", None) or config.n_embd)


def pair_cost(width: int) -> float:
    """One attended (query, key) pair against one token through the linear layers: about 4·width FLOPs of
    attention per layer against about 24·width² of projections and MLP."""
    return 1.0 / (6 * width)


def why_not_packed(model) -> str | None:
    """Why `model`'s forwards cannot run packed rows (None: they can)."""
    if getattr(model, "run_in_root_forward", None) is not None:
        return "sharded at its root (FSDP2 brackets one forward per call)"
    config = model.config
    attention = getattr(config, "_attn_implementation", None)
    if attention not in PACKABLE_ATTENTION:
        return f"attention implementation {attention!r} (packing needs one of {sorted(PACKABLE_ATTENTION)})"
    windowed = why_windowed(config)
    return None if windowed is None else f"{windowed} (a packed row's mask is full attention)"


def why_windowed(config) -> str | None:
    """What in a model `config` attends to less than the whole sequence so far (None: nothing)."""
    layer_types = set(getattr(config, "layer_types", None) or ())
    if layer_types - {"full_attention"}:
        return f"layer types {sorted(layer_types - {'full_attention'})}"
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return f"a sliding window of {config.sliding_window}"
    return None


def response_positions(response_length: int) -> int:
    """Positions a response takes in a row: all its tokens but the last, which is no input."""
    return max(response_length - 1, 0)


def tree_parts(prompt_length: int, response_lengths: dict[int, int], row_cap: int) -> list[list[int]]:
    """The sequences of one prompt cut into trees of at most `row_cap` positions (a tree too long alone is kept
    whole); `response_lengths`: sequence index -> positions its response takes in a row."""
    parts: list[list[int]] = []
    length = row_cap + 1
    for seq, positions in response_lengths.items():
        if parts and length + positions <= row_cap:
            parts[-1].append(seq)
            length += positions
        else:
            parts.append([seq])
            length = prompt_length + positions
    return parts


def least_filled(lengths: list[int], rows: int) -> list[list[int]]:
    """Items (by index) onto `rows` rows, longest first, each onto the row least filled so far: the longest row
    within 4/3 of the best possible."""
    heap = [(0, r) for r in range(rows)]
    placed: list[list[int]] = [[] for _ in range(rows)]
    for item in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        fill, row = heapq.heappop(heap)
        placed[row].append(item)
        heapq.heappush(heap, (fill + lengths[item], row))
    return [sorted(r) for r in placed if r]


def rows_cost(row_lengths: list[int], pair_cost: float) -> float:
    """Rows padded to the longest: its tokens plus every (query, key) pair of each row at `pair_cost`."""
    width = max(row_lengths, default=0)
    return len(row_lengths) * (width + pair_cost * width * width)


def row_cap(width: int, longest_tree: int) -> int:
    """The longest row a plan makes: where a row's attention costs as much as its linear layers (a longer row
    costs more per token), or the longest single-response tree if that is longer."""
    return max(int(1 / pair_cost(width)), longest_tree)


def plan_rows(prompt_lengths: list[int], prompt_of: list[int], response_lengths: list[int], width: int
              ) -> list[list[Tree]]:
    """The cheapest rows (`rows_cost`) for sequences whose prompts (`prompt_of[i]` indexes `prompt_lengths`)
    are followed by responses of `response_lengths[i]` tokens: each a list of trees."""
    positions = {i: response_positions(r) for i, r in enumerate(response_lengths)}
    by_prompt: dict[int, dict[int, int]] = {}
    for i, p in enumerate(prompt_of):
        by_prompt.setdefault(p, {})[i] = positions[i]
    cap = row_cap(width, max(prompt_lengths[p] + max(seqs.values()) for p, seqs in by_prompt.items()))
    trees: list[Tree] = [(p, part) for p, seqs in by_prompt.items()
                         for part in tree_parts(prompt_lengths[p], seqs, cap)]
    lengths = [prompt_lengths[p] + sum(positions[i] for i in part) for p, part in trees]
    fewest = max(1, math.ceil(sum(lengths) / cap))
    best: tuple[float, list[list[int]]] | None = None
    for count in range(fewest, min(len(trees), fewest + MORE_ROWS_TRIED) + 1):
        rows = least_filled(lengths, count)
        row_lengths = [sum(lengths[t] for t in row) for row in rows]
        if max(row_lengths) > cap and count < len(trees):
            continue
        cost = rows_cost(row_lengths, pair_cost(width))
        if best is None or cost < best[0]:
            best = (cost, rows)
    if best is None:  # no count in the window fits: one tree per row
        best = (0.0, [[t] for t in range(len(trees))])
    return [[trees[t] for t in row] for row in best[1]]


def plan_cost(plan: list[list[Tree]], prompt_lengths: list[int], response_lengths: list[int],
              width: int) -> float:
    """`rows_cost` of a plan (`plan_rows`)."""
    lengths = [sum(prompt_lengths[p] + sum(response_positions(response_lengths[i]) for i in seqs)
                   for p, seqs in row) for row in plan]
    return rows_cost(lengths, pair_cost(width))


@dataclass(frozen=True, kw_only=True)
class PackedRows:
    """A plan laid out as tensors, each [rows, row length] (padding: `pad_id`, position 0, segment -1)."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    segment: torch.Tensor
    """A number per prompt copy and per response within the row; -1 on padding."""
    tree: torch.Tensor
    """The segment of the prompt each position's tree starts with (its own for a prompt position)."""
    predictors: torch.Tensor
    """For every response token of every sequence, in the row-major order of the [N, T] response mask: the
    flat index (row * row length + position) of the hidden state that predicts it."""

    def allowed(self) -> torch.Tensor:
        """[rows, L, L] bool, query by key: earlier positions of the query's own segment and of its tree's
        prompt; a padding position attends to itself alone (a query with no key would give NaN)."""
        seg, tree = self.segment, self.tree
        length = seg.shape[1]
        causal = torch.ones(length, length, dtype=torch.bool, device=seg.device).tril()
        same = (seg[:, :, None] == seg[:, None, :]) | (tree[:, :, None] == seg[:, None, :])
        pad = seg[:, :, None] < 0
        diagonal = torch.eye(length, dtype=torch.bool, device=seg.device)
        return (same & causal & ~pad) | (pad & diagonal)


def lay_out(plan: list[list[Tree]], prompts: list[list[int]], responses: list[list[int]], pad_id: int
            ) -> PackedRows:
    """The tensors of `plan` (`plan_rows`) for the distinct `prompts` and each sequence's response tokens."""
    ids, pos, seg, tree_of = [], [], [], []
    predictor: dict[int, list[int]] = {}
    for row in plan:
        row_ids: list[int] = []
        row_pos: list[int] = []
        row_seg: list[int] = []
        row_tree: list[int] = []
        segments = 0
        for p, seqs in row:
            prompt, root = prompts[p], segments
            row_ids += prompt
            row_pos += range(len(prompt))
            row_seg += [root] * len(prompt)
            row_tree += [root] * len(prompt)
            last = len(row_ids) - 1
            segments += 1
            for i in seqs:
                inputs = responses[i][:-1]
                start = len(row_ids)
                # Token 0 is predicted by the prompt's last position, token t by the response's position t-1.
                predictor[i] = [(len(ids), last)] + [(len(ids), start + t) for t in range(len(inputs))]
                row_ids += inputs
                row_pos += range(len(prompt), len(prompt) + len(inputs))
                row_seg += [segments] * len(inputs)
                row_tree += [root] * len(inputs)
                segments += 1
        ids.append(row_ids)
        pos.append(row_pos)
        seg.append(row_seg)
        tree_of.append(row_tree)
    length = max(map(len, ids))
    flat = [row * length + at for i in range(len(responses)) for row, at in predictor[i]]
    return PackedRows(input_ids=padded_rows(ids, pad_id)[0], position_ids=padded_rows(pos, 0)[0],
                      segment=padded_rows(seg, -1)[0], tree=padded_rows(tree_of, -2)[0],
                      predictors=torch.tensor(flat, dtype=torch.long))


def attention_mask(rows: PackedRows, model, device) -> torch.Tensor:
    """The 4D mask [rows, 1, L, L] the model's attention takes as is: boolean (True attends) for sdpa,
    additive (0 or the dtype's lowest) for eager."""
    allowed = rows.allowed()[:, None].to(device)
    if model.config._attn_implementation == "sdpa":
        return allowed
    dtype = next(model.parameters()).dtype
    return torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill(~allowed, torch.finfo(dtype).min)


def packed_logprobs(model, sequences: list[list[int]], response_starts: list[int],
                    params: SamplingParams | None = None, pad_id: int = 0,
                    plan: list[list[Tree]] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`modeling.sequence_logprobs(model, sequences, response_starts, params, pad_id)` ([N, T] log-probs and
    mask; differentiable when grad is enabled) from one forward of packed rows: `plan`, or the one `plan_rows`
    makes. Every response must hold at least one token and the model must take packed rows (`why_not_packed`)."""
    check_response_starts(sequences, response_starts)
    distinct, prompt_of = distinct_prompts([seq[:start] for seq, start in zip(sequences, response_starts)])
    responses = [seq[start:] for seq, start in zip(sequences, response_starts)]
    if not all(responses):
        raise ValueError("packed rows need a response token in every sequence")
    if plan is None:
        plan = plan_rows([len(p) for p in distinct], prompt_of, [len(r) for r in responses], model_width(model))
    return run_packed(model, lay_out(plan, distinct, responses, pad_id), responses, params)


def run_packed(model, rows: PackedRows, responses: list[list[int]], params: SamplingParams | None
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """One forward of `rows`; each response token's log-prob from the hidden state that predicts it."""
    device = next(model.parameters()).device
    hidden = model.base_model(input_ids=rows.input_ids.to(device), position_ids=rows.position_ids.to(device),
                              attention_mask=attention_mask(rows, model, device), use_cache=False).last_hidden_state
    targets, mask = padded_rows(responses, 0)
    targets, mask = targets.to(device), mask.bool().to(device)
    picked = hidden.reshape(-1, hidden.shape[-1])[rows.predictors.to(device)]
    flat = token_logprobs(model.get_output_embeddings(), picked, targets[mask], params)
    logp = torch.zeros(mask.shape, dtype=torch.float32, device=device).masked_scatter(mask, flat)
    return logp, mask
