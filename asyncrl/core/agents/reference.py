"""A reference episode for supervised warm starts: the task's correct turns played against the real
environment, so the observations between them are what training will see (pure but for the environment)."""

from __future__ import annotations

from asyncrl.core.agents.episode import Episode
from asyncrl.core.engines.base import Generation


def reference_episode(episodes, task, prompt) -> tuple[list[int], list[int], list[float]]:
    """(context ids, response ids, train mask: 1 on the model's tokens, 0 on the observations') of the task's
    target turns on `prompt` (`Task.target_turns`), each turn ended with EOS."""
    tokenizer, renderer = episodes.tokenizer, episodes.renderer()
    session = episodes.environment.start(prompt)
    try:
        episode = Episode(key=0, prompt=prompt, context=renderer.first_context(prompt, list(session.opening)),
                          session=session)
        limit = 1 << 30
        for text in task.target_turns(prompt):
            ids = tokenizer.encode_text(text) + [tokenizer.eos_id]
            episode.add_turn(Generation(token_ids=ids, logp_behav=[0.0] * len(ids), weight_version=[0] * len(ids),
                                        finished=True), limit)
            step = session.step(text)
            if step.done:
                break
            episode.add_observation(renderer.observation(step.messages), limit)
    finally:
        session.close()
    mask = [1.0] * len(episode.token_ids)
    for start, end in zip(episode.observation_starts, episode.observation_ends):
        mask[start:end] = [0.0] * (end - start)
    return episode.context, episode.token_ids, mask
