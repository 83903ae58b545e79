"""Batching in a task of your own: a module-level `@batched` function and a `SharedBatcher` engine.

flyte run --local workflows/own_task.py answer --questions '["What is 2 + 2?", "Name a prime."]'
flyte run --local workflows/own_task.py count_words --texts '["one two", "three"]'
flyte deploy workflows/own_task.py env
"""

import asyncio

import flyte

from flyteplugins_batcher import SharedBatcher, batched, inference_environment
from flyteplugins_batcher.engines import GenerationConfig, create_engine
from flyteplugins_batcher.images import GPU_SPEC

# Reusable replicas: each keeps one process, and its concurrent calls share that process's batchers.
env = inference_environment("my_llm", image=GPU_SPEC.resolve(), gpu="L4:1", replicas=2, concurrency=16)


def load(model: str | None):
    engine = create_engine(model=model, generation=GenerationConfig(max_new_tokens=64))
    engine.load()  # once per process, in a worker thread
    return engine


# One engine and one running batcher per process, shared by every call on the replica.
llm = SharedBatcher(load, lambda engine, _model: engine.batcher())


@batched(max_batch_size=64)  # callers pass one text; the function gets a batch
def word_counts(texts: list[str]) -> list[int]:
    return [len(text.split()) for text in texts]


@env.task
async def answer(questions: list[str], model: str | None = None) -> list[str]:
    batcher = await llm.get(model)
    completions = await batcher.run(questions)  # batched with every other call on this replica
    return [completion.text for completion in completions]


@env.task
async def count_words(texts: list[str]) -> list[int]:
    return list(await asyncio.gather(*(word_counts(text) for text in texts)))


if __name__ == "__main__":
    flyte.init()
    print(flyte.with_runcontext(mode="local").run(answer, questions=["What is 2 + 2?"]).outputs())
