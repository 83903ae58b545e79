"""The Batch API at cluster scale: the app is the control plane, each batch a Flyte run on the GPU replicas.

    flyte create secret batcher-database-url 'postgresql://batcher:PASSWORD@db.internal:5432/batcher'
    flyte deploy workflows/serve_cluster.py app_env     # the app, the JSONL job and its LLM and embedding replicas

Each batch created through `/v1/batches` becomes a run of the JSONL job (`run_batch_file`, the task
behind `flyteplugins-batcher run-batch`): its chunks fan out to the reusable GPU replicas, which
Flyte queues and scales, while the app's own engine answers online requests. Two app replicas share
their batches and files through PostgreSQL and the object store; when one stops, the other takes its
batches over. The batch object names its run (`flyte_run`), to open in Flyte's UI.
"""

import flyte
import flyte.app

from flyteplugins_batcher.replica import EngineSettings
from flyteplugins_batcher.server import BatcherAppEnvironment, ServerSettings

app_env = BatcherAppEnvironment(
    name="batcher-batch-api",
    settings=ServerSettings(
        engine=EngineSettings(max_new_tokens=512),
        batch_executor="flyte",  # batches run as Flyte runs of the JSONL job
        runs_uri="s3://my-bucket/batcher/runs",  # where runs and the app meet: inputs, journals, outputs
        files_uri="s3://my-bucket/batcher/files",  # uploads and batch outputs, shared by the app's replicas
    ),
    secrets=flyte.Secret(key="batcher-database-url", as_env_var="BATCH_SERVE_DATABASE_URL"),
    scaling=flyte.app.Scaling(replicas=(2, 2)),
    resources=flyte.Resources(cpu=4, memory="32Gi", gpu="L4:1"),
)
