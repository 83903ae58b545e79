"""Batch jobs on your own data: an OpenAI-batch JSONL file in, results and errors out.

    flyte run --local workflows/batch_jsonl.py main --input requests.jsonl --output_dir out/
    flyte run workflows/batch_jsonl.py main --input s3://bucket/requests.jsonl --output_dir s3://bucket/out
    flyte deploy workflows/batch_jsonl.py driver_env

The same job runs without Flyte's CLI: `flyteplugins-batcher run-batch -i requests.jsonl -o out/`.
Chat and completion lines run on the LLM replicas, embedding lines on the embedding replicas; a bad
line fails alone, in `errors.jsonl`.
"""

from flyteplugins_batcher.jobs import jsonl_driver_env as driver_env
from flyteplugins_batcher.jobs import run_batch_file as main

__all__ = ["driver_env", "main"]
