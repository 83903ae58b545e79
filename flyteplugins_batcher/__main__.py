"""`python -m flyteplugins_batcher run-batch | serve | gsm8k`: the same commands as `flyteplugins-batcher`."""

from __future__ import annotations

from flyteplugins_batcher.cli import main

if __name__ == "__main__":
    main()
