"""Planning `generate` passes for an engine that pads: which prompts share a call, and how many rows each takes.

Records share a pass when they share the settings a whole `generate` call takes (length limit,
temperature, top-p, stop strings, seed, penalties, logit bias). What can differ row by row does
not split passes: a response format (each row has its own grammar matcher), logprobs (each row
records its own), a LoRA adapter (peft runs each row's own) and the number of samples (a record asking
for `n` samples takes `n` rows; a greedy record takes one row, whose sample is repeated, since
greedy samples are identical).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

from flyteplugins_batcher.engines._completion import Completion, Sample
from flyteplugins_batcher.engines._config import GenerationConfig
from flyteplugins_batcher.engines._prompts import PreparedPrompt


def pass_settings(generation: GenerationConfig) -> GenerationConfig:
    """The settings a whole pass shares: `generation` without what each row carries itself."""
    if generation.n == 1 and generation.response_format is None and generation.logprobs is None:
        return generation
    return replace(generation, n=1, response_format=None, logprobs=None)


@dataclass(frozen=True)
class Pass:
    """One `generate` call: prompts with the same pass settings, each taking its decoded samples' rows.

    Attributes:
        settings: The settings the call runs with (see `pass_settings`).
        prompts: Its prompts; all rows of a prompt are in the same pass.
    """

    settings: GenerationConfig
    prompts: tuple[PreparedPrompt, ...]

    @property
    def rows(self) -> list[PreparedPrompt]:
        """One entry per batch row: each prompt repeated once per sample it decodes."""
        return [prompt for prompt in self.prompts for _ in range(prompt.generation.decoded_samples)]

    def completions(self, samples: Sequence[Sample]) -> list[Completion]:
        """Each prompt's completion from the samples of its rows (in row order); greedy samples repeated `n` times."""
        if len(samples) != len(self.rows):
            raise ValueError(f"a pass of {len(self.rows)} rows got {len(samples)} samples")
        completions, start = [], 0
        for prompt in self.prompts:
            decoded = prompt.generation.decoded_samples
            own = list(samples[start : start + decoded])
            start += decoded
            if decoded < prompt.generation.n:
                own *= prompt.generation.n
            completions.append(Completion.from_samples(len(prompt.token_ids), own))
        return completions


def plan_passes(prompts: Sequence[PreparedPrompt], max_rows: int | None) -> Iterator[Pass]:
    """Passes over `prompts`: by pass settings, then by prompt length, at most `max_rows` rows each.

    A prompt that needs more rows than `max_rows` gets a pass of its own (its samples are never
    split across passes).
    """
    by_settings: dict[GenerationConfig, list[PreparedPrompt]] = {}
    for prompt in prompts:
        by_settings.setdefault(pass_settings(prompt.generation), []).append(prompt)
    for settings, same_settings in by_settings.items():
        chunk: list[PreparedPrompt] = []
        rows = 0
        for prompt in sorted(same_settings, key=lambda prompt: len(prompt.token_ids)):
            needed = prompt.generation.decoded_samples
            if chunk and max_rows is not None and rows + needed > max_rows:
                yield Pass(settings, tuple(chunk))
                chunk, rows = [], 0
            chunk.append(prompt)
            rows += needed
        if chunk:
            yield Pass(settings, tuple(chunk))
