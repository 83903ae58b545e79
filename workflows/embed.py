"""Embed a corpus on reusable GPU replicas, with length-aware `@batched` batches, into a Parquet dataset.

flyte run --local workflows/embed.py main                       # a sample corpus, all-MiniLM-L6-v2 on CPU
flyte run --local workflows/embed.py main --corpus docs.jsonl   # {"id"?, "text"} per line, or a .txt file
EMBED_MODEL=BAAI/bge-small-en-v1.5 flyte run workflows/embed.py main --corpus s3://bucket/docs.jsonl
"""

from flyteplugins_batcher.jobs import embed_corpus as main
from flyteplugins_batcher.jobs import table_driver_env as driver_env

__all__ = ["driver_env", "main"]
