"""_jsonl."""
