"""LLM serving across real processes: hf worker + frontend over etcd, static mode on NATS,
flag validation, killing the only worker, and README command one answering curl."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import shlex
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from helpers import FRONTEND, HF_WORKER, ROOT, RuntimeFactory, collect, free_port, metric_value, pid_gone

from dynamo_nb import ConfigError
from dynamo_nb.llm import ModelTokenizer

pytestmark = [pytest.mark.processes, pytest.mark.timeout(120)]

HI = [{"role": "user", "content": "Hello! How are you today?"}]


async def wait_for_model(url: str, name: str, timeout: float = 20.0) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=5) as http:
        for _ in range(int(timeout / 0.1)):
            models = (await http.get("/v1/models")).json()["data"]
            if name in [m["id"] for m in models]:
                return
            await asyncio.sleep(0.1)
    raise AssertionError(f"{name} never appeared at {url}/v1/models")


async def test_worker_and_frontend_processes_over_etcd(
    services: Any, start_worker: Any, make_runtime: RuntimeFactory, tiny_path: Any
) -> None:
    port = free_port()
    etcd = ["--discovery", services.etcd_url]
    worker = await start_worker(
        *etcd, "--endpoint", "xp.backend.generate", "--lease-ttl", "2", script=HF_WORKER
    )
    assert "model=tiny-llama" in worker.ready_line
    frontend = await start_worker(*etcd, "--http-port", str(port), script=FRONTEND)
    url = f"http://127.0.0.1:{port}"
    assert frontend.ready_line == f"READY frontend url={url}"
    await wait_for_model(url, "tiny-llama")
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)

    # greedy output through the frontend equals what the worker endpoint streams when asked straight
    tokenizer = ModelTokenizer.load(tiny_path)
    ids = tokenizer.encode(tokenizer.render_chat(HI), add_special_tokens=False)
    rt = await make_runtime("etcd-tcp")
    direct = await rt.endpoint("xp.backend.generate").client()
    await direct.wait_for_instances(timeout=10)
    items = await collect(
        direct.round_robin(
            {
                "token_ids": ids,
                "stop_conditions": {"max_tokens": 20},
                "sampling_options": {"temperature": 0},
                "eos_token_ids": [2, 0],
            }
        )
    )
    expected = tokenizer.decode([t for item in items for t in item["token_ids"]])  # type: ignore[index]

    reply = await client.chat.completions.create(
        model="tiny-llama", messages=HI, max_tokens=20, temperature=0
    )
    assert reply.choices[0].message.content == expected
    stream = await client.chat.completions.create(
        model="tiny-llama", messages=HI, max_tokens=20, temperature=0, stream=True
    )
    assert "".join([c.choices[0].delta.content or "" async for c in stream]) == expected
    completion = await client.completions.create(
        model="tiny-llama",
        prompt="Once upon a time",
        max_tokens=8,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert completion.usage.completion_tokens == 8 and completion.choices[0].finish_reason == "length"
    assert completion.usage.prompt_tokens == len(tokenizer.encode("Once upon a time"))

    # kill the only worker: the next request gets 503 at once, not a hang
    worker.send_signal(signal.SIGKILL)
    await worker.wait()
    async with httpx.AsyncClient(base_url=url, timeout=10) as http:
        body = {"model": "tiny-llama", "messages": HI, "max_tokens": 4}
        response = await http.post("/v1/chat/completions", json=body)
        assert response.status_code == 503, response.text
        assert response.json()["error"]["type"] == "service_unavailable_error"
        for _ in range(150):  # bounded: the lease (2 s) expires, then the card is gone
            if not (await http.get("/v1/models")).json()["data"]:
                break
            await asyncio.sleep(0.1)
        assert (await http.get("/v1/models")).json()["data"] == []
        response = await http.post("/v1/chat/completions", json=body)
        assert response.status_code == 503  # the model is still refused, not a hang
        assert (await http.get("/health")).status_code == 503
    await client.close()


async def test_static_mode_on_nats_without_etcd(services: Any, start_worker: Any, tiny_path: Any) -> None:
    port = free_port()
    nats = ["--nats-url", services.nats_url]
    worker = await start_worker("--static", *nats, "--endpoint", "static.backend.generate", script=HF_WORKER)
    assert "address=nats://" in worker.ready_line
    await start_worker(
        "--static-endpoint",
        "static.backend.generate",
        "--model-name",
        "tiny-static",
        "--model-path",
        str(tiny_path),
        *nats,
        "--http-port",
        str(port),
        script=FRONTEND,
    )
    url = f"http://127.0.0.1:{port}"
    await wait_for_model(url, "tiny-static", timeout=5)
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0) as client:
        reply = await client.chat.completions.create(
            model="tiny-static", messages=HI, max_tokens=6, temperature=0
        )
        assert reply.usage.completion_tokens >= 1 and reply.choices[0].message.content is not None
        stream = await client.completions.create(
            model="tiny-static", prompt="Hello", max_tokens=6, stream=True
        )
        assert len([c async for c in stream]) >= 2


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (
            ["--static-endpoint", "backend.generate", "--model-name", "m", "--model-path", "{tiny}"],
            "is not namespace.component.endpoint",
        ),
        (["--static-endpoint", "dynamo.backend.generate", "--model-path", "{tiny}"], "needs --model-name"),
        (["--static-endpoint", "dynamo.backend.generate"], "needs --model-name and --model-path"),
        (
            ["--static-endpoint", "dynamo.backend.generate", "--model-name", " ", "--model-path", "{tiny}"],
            "--model-name is empty",
        ),
        (
            [
                "--static-endpoint",
                "dynamo.backend.generate",
                "--model-name",
                "m",
                "--model-path",
                "/no/such/dir",
            ],
            "is not a directory",
        ),
        (
            ["--static-endpoint", "dynamo.backend.generate", "--model-name", "m", "--model-path", "{empty}"],
            "holds no tokenizer.json",
        ),
        (
            ["--static-endpoint", "dynamo.backend.generate", "--model-name", "m", "--model-path", "{tiny}"],
            "--static-address",
        ),
        (["--model-name", "m"], "--discovery etcd://HOST:PORT"),
        (
            ["--runtime", "dynamo", "--discovery", "file:///tmp/x"],
            "its frontend is python -m dynamo.frontend",
        ),
    ],
)
def test_frontend_flags_fail_fast_with_the_fix(
    flags: list[str], says: str, tiny_path: Any, tmp_path: Any
) -> None:
    argv = [f.format(tiny=tiny_path, empty=tmp_path) for f in flags]
    done = subprocess.run([sys.executable, str(FRONTEND), *argv], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert says in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("component", [FRONTEND, HF_WORKER])
def test_components_help_shows_every_default(component: Any) -> None:
    done = subprocess.run(
        [sys.executable, str(component), "--help"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and "--discovery" in done.stdout and "--model-path" in done.stdout
    # the flag definitions are importable (a launcher reuses them), and each value flag names its default
    spec = importlib.util.spec_from_file_location(component.stem, component)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    parser = module.build_parser()
    value_flags = [a for a in parser._actions if a.option_strings and a.nargs != 0]
    assert len(value_flags) >= 10
    assert [a.option_strings[0] for a in value_flags if "default" not in (a.help or "")] == []
    for action in value_flags:
        assert " ".join(action.option_strings[0].split()) in done.stdout


def readme_command_one() -> str:
    first = (ROOT / "README.md").read_text().split("```bash", 1)[1].strip().splitlines()[0]
    command = first.split("#", 1)[0].split("&&", 1)[1].strip()
    assert command.startswith("python3 -m dynamo_nb run --in http --out hf"), command
    return command


async def test_readme_command_one_serves_and_answers_curl(start_worker: Any) -> None:
    port = free_port()
    argv = [*shlex.split(readme_command_one())[3:], "--http-port", str(port)]  # after `python3 -m dynamo_nb`
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "dynamo_nb",
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        cwd=str(ROOT),
    )
    try:
        assert process.stdout is not None
        lines = []
        while not any(line.startswith("READY frontend") for line in lines):
            line = (await asyncio.wait_for(process.stdout.readline(), 60)).decode()
            assert line, "".join(lines)
            lines.append(line)
        assert "models=tiny-llama" in lines[-1]
        body = json.dumps({"model": "tiny-llama", "messages": HI, "max_tokens": 8})
        curl = await asyncio.create_subprocess_exec(
            "curl",
            "-sS",
            "--max-time",
            "30",
            f"http://127.0.0.1:{port}/v1/chat/completions",
            "-H",
            "Content-Type: application/json",
            "-d",
            body,
            stdout=asyncio.subprocess.PIPE,
        )
        out, _ = await asyncio.wait_for(curl.communicate(), 40)
        reply = json.loads(out)
        assert reply["object"] == "chat.completion" and reply["usage"]["completion_tokens"] >= 1
        assert isinstance(reply["choices"][0]["message"]["content"], str)
    finally:
        process.terminate()
        assert await asyncio.wait_for(process.wait(), 10) == 0


# a frontend as components/frontend.py runs it, and as `python -m dynamo_nb run` does (frontend only)
FRONTEND_COMMANDS = {
    "components/frontend.py": (FRONTEND, []),
    "dynamo_nb run": ("-m", ["dynamo_nb", "run", "--in", "http", "--out", "dyn://dynamo.backend.generate"]),
}


@pytest.mark.parametrize("command", FRONTEND_COMMANDS)
async def test_http_workers_share_the_port_and_stop_together(
    command: str, services: Any, start_worker: Any
) -> None:
    """``--http-workers 2``: two frontend processes on one port (SO_REUSEPORT), each with its own
    routers; connections spread between them; both stop with the first."""
    etcd = ["--discovery", services.etcd_url]
    await start_worker(
        *etcd, "--model-name", "mock", "--speedup-ratio", "1000", script=ROOT / "components/mocker_worker.py"
    )
    port = free_port()
    program, leading = FRONTEND_COMMANDS[command]
    frontend = await start_worker(
        *leading, *etcd, "--http-port", str(port), "--http-workers", "2", script=program
    )
    url = f"http://127.0.0.1:{port}"
    replicas = [pid for pid in child_pids(frontend.pid) if "reaper.py" not in cmdline(pid)]
    assert len(replicas) == 1, replicas  # and the frontend's reaper, which stops it if need be
    body = {"model": "mock", "messages": HI, "max_tokens": 4}
    one_connection_each = httpx.Limits(max_keepalive_connections=0)  # a new connection per request
    async with httpx.AsyncClient(base_url=url, timeout=30, limits=one_connection_each) as http:
        for _ in range(100):  # each process learns the model from discovery on its own
            served = {(await http.get("/v1/models")).json()["data"] != [] for _ in range(8)}
            if served == {True}:
                break
            await asyncio.sleep(0.1)
        replies = await asyncio.gather(*(http.post("/v1/chat/completions", json=body) for _ in range(40)))
        assert [r.status_code for r in replies] == [200] * 40
        counts = set()
        for _ in range(30):  # /metrics answers from whichever process took the connection
            text = (await http.get("/metrics")).text
            counts.add(
                metric_value(
                    text,
                    "dynamo_frontend_requests_total",
                    model="mock",
                    endpoint="chat_completions",
                    status="success",
                )
            )
    # both served, every request counted once: two counts adding up to 40, or 20 each (then
    # both processes show the same count; one process that served all 40 would show 40)
    assert (len(counts) == 2 and None not in counts and sum(counts) == 40) or counts == {20.0}, counts
    await frontend.stop(timeout=10)  # SIGTERM: it stops its replica
    assert all([await pid_gone(pid, timeout=10) for pid in replicas])


def cmdline(pid: int) -> str:
    """The command line of process ``pid`` ("" once it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def child_pids(parent: int) -> list[int]:
    """The pids whose parent is ``parent`` (Linux /proc)."""
    children = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
                children.append(int(entry.name))
    return children


async def test_http_workers_with_an_engine_in_the_same_process_is_refused() -> None:
    """``dynamo_nb run --out echo --http-workers 2`` would start an engine per process: refused,
    naming how to split them."""
    from dynamo_nb.run import run

    with pytest.raises(ConfigError, match=r"--http-workers 2 .* serve the engine apart \(--in dyn://"):
        await run(["--in", "http", "--out", "echo", "--http-workers", "2"])
