"""The OpenAI-compatible batch server as a Flyte app.

    flyteplugins-batcher serve                          # 127.0.0.1:8000, the bundled SmolLM2 and MiniLM on CPU
    flyte serve --local workflows/serve.py app_env      # the same app through flyte's CLI
    flyte deploy workflows/serve.py app_env             # on Union, behind its authentication

Then point any OpenAI client at it: `OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="unused")`.
"""

import flyte

from flyteplugins_batcher.replica import EngineSettings
from flyteplugins_batcher.server import BatcherAppEnvironment, ServerSettings

app_env = BatcherAppEnvironment(
    name="batcher-openai",
    settings=ServerSettings(engine=EngineSettings(max_new_tokens=512)),
    resources=flyte.Resources(cpu=4, memory="32Gi", gpu="L4:1"),
)
