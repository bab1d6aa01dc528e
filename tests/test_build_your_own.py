"""Build your own, as a new user meets it: a notebook written with ``nbformat`` (no kernel ever ran
it, so it has no ``language_info``) declares an engine that subclasses the hf engine *and* a
routing policy. One rule finds either (graph, ``--router-policy``, `launch`, the export check),
``FILE:NAME`` works for every kind, the plain ``jupyter nbconvert --to script`` gives a ``.py``,
and the worker runs for real behind the frontend, routed by the policy of the same notebook,
aggregated and as a prefill + decode pair."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import nbformat
import pytest
import yaml
from helpers import ROOT, write_notebook

from dynamo_nb import ConfigError, EngineProgram, LocalServices, RoutingPolicy, bench, launch
from dynamo_nb.engines import EchoEngine
from dynamo_nb.graph import Graph, check_graph
from dynamo_nb.jupyter import NOTEBOOK_ONLY_TAG
from dynamo_nb.launch.programs import (
    check_exported_cells,
    check_program_source,
    declarations,
    export_notebook,
)
from dynamo_nb.notebook.component_program import find_component, load_component

pytestmark = pytest.mark.timeout(300)

IMPORTS = """\
import sys
import contextlib

from dynamo_nb import EngineProgram, RoutingPolicy, in_notebook
from dynamo_nb.engines.hf import HFEngine
from dynamo_nb.llm import LLMEngineOutput
"""

ENGINE = '''\
ANSWER_TOKENS = 3


async def first_tokens(request, stream):
    """The inner stream's items until ANSWER_TOKENS tokens, the last one a final item: the
    stream is ended early (and the inner one closed, which frees its sequence)."""
    sent = 0
    async with contextlib.aclosing(stream) as items:
        async for item in items:
            tokens = item.token_ids[: ANSWER_TOKENS - sent]
            sent += len(tokens)
            if sent >= ANSWER_TOKENS:
                yield LLMEngineOutput.final(
                    tokens, "stop", prompt_tokens=len(request.token_ids), completion_tokens=sent
                )
                return
            yield item


class ShortAnswers(HFEngine):
    """The hf engine, every answer ended after its first three tokens: aggregated and as decode."""

    async def generate(self, request, context=None):
        async for item in first_tokens(request, super().generate(request, context)):
            yield item

    async def decode(self, request, context=None):
        async for item in first_tokens(request, super().decode(request, context)):
            yield item
'''

POLICY = '''\
def long_prompts_apart(request, instance_ids):
    """Prompts of over 40 tokens to the highest instance id, the others to the lowest."""
    ids = sorted(instance_ids)
    return ids[-1] if len(request.token_ids) > 40 else ids[0]


policy = RoutingPolicy(long_prompts_apart)
'''

DECLARATION = """\
DEPLOYMENT = {"name": "short-worker", "namespace": "dynamo", "resources": {"cpu": 1, "memory": "2Gi"}}

worker = EngineProgram(ShortAnswers, deployment=DEPLOYMENT, model_name="short")
"""

TRY_IT = "answer = await worker.serve(runtime)"

ENTRY = """\
if __name__ == "__main__" and not in_notebook():
    sys.exit(worker.run())
"""


def write_unrun_notebook(path: Path, *cells: str | tuple[str, str]) -> Path:
    """A notebook as ``nbformat`` writes it: no kernel spec, no ``language_info``."""
    write_notebook(path, *cells, ran_in_kernel=False)
    assert "language_info" not in nbformat.read(path, as_version=4).metadata
    return path


@pytest.fixture
def notebook(tmp_path: Path) -> Path:
    return write_unrun_notebook(
        tmp_path / "short.ipynb", IMPORTS, ENGINE, POLICY, DECLARATION, (TRY_IT, NOTEBOOK_ONLY_TAG), ENTRY
    )


# ----------------------------------------------------------------------------- one rule for lookups


def test_a_worker_and_a_policy_in_one_file_are_each_found_by_kind() -> None:
    worker = EngineProgram(EchoEngine)
    policy = RoutingPolicy(min)
    module = {"worker": worker, "policy": policy}
    assert find_component(module, "nb.ipynb", runnable=True) is worker
    assert find_component(module, "nb.ipynb", runnable=False) is policy
    assert find_component(module, "nb.ipynb", runnable=False, name="policy") is policy
    with pytest.raises(ConfigError, match=r"nb.ipynb: worker is a engine; a RoutingPolicy is expected"):
        find_component(module, "nb.ipynb", runnable=False, name="worker")
    with pytest.raises(
        ConfigError, match=r"declares 2 of the kind wanted here .*: name one, nb.ipynb:worker$"
    ):
        find_component(module, "nb.ipynb")  # any kind: two candidates
    with pytest.raises(
        ConfigError, match=r"nb.ipynb declares no 'nope' \(it declares worker \(engine\), policy"
    ):
        find_component(module, "nb.ipynb", name="nope")


def test_the_static_check_follows_the_same_rule_and_the_entry_point() -> None:
    source = "worker = EngineProgram(E)\npolicy = RoutingPolicy(p)\n" + ENTRY
    assert check_program_source(source, "nb.ipynb") == "worker"
    assert check_program_source(source, "nb.ipynb", name="worker") == "worker"
    assert check_program_source(source, "nb.ipynb", runnable=False) == "policy"
    with pytest.raises(
        ConfigError, match=r"policy is a routing policy; a worker .* --router-policy FILE:NAME"
    ):
        check_program_source(source, "nb.ipynb", name="policy")
    two = "worker = EngineProgram(E)\nother = EngineProgram(F)\n" + ENTRY
    with pytest.raises(ConfigError, match=r"nb.ipynb:other: its entry point runs worker, not other"):
        check_program_source(two, "nb.ipynb", name="other")


# ----------------------------------------------------------------------------- export


def test_a_cell_that_awaits_at_top_level_is_named_with_its_number(tmp_path: Path) -> None:
    path = write_unrun_notebook(tmp_path / "awaits.ipynb", IMPORTS, "x = 1\nawait start()", ENTRY)
    with pytest.raises(ConfigError) as caught:
        check_exported_cells(path)
    message = str(caught.value)
    assert "cell 2 ('x = 1') awaits at top level" in message and "tag that cell notebook-only" in message
    tagged = write_unrun_notebook(tmp_path / "tagged.ipynb", IMPORTS, ("await start()", NOTEBOOK_ONLY_TAG))
    check_exported_cells(tagged)  # the tagged cell is left out of the export: nothing to refuse


@pytest.mark.processes
def test_plain_nbconvert_exports_an_unrun_notebook_as_python(notebook: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "jupyter", "nbconvert", "--to", "script", str(notebook), "--output-dir", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["short.py"]
    source = (tmp_path / "out" / "short.py").read_text()
    compile(source, "short.py", "exec")  # plain Python: the notebook-only cell is gone
    assert "await worker.serve" not in source and "class ShortAnswers(HFEngine)" in source


# ----------------------------------------------------------------------------- graph and frontend


def graph_yaml(notebook: Path, worker: str, policy: str) -> str:
    return yaml.safe_dump(
        {
            "name": "short",
            "services": {"etcd": "local"},
            "components": {
                "short": {"component": worker, "flags": {"max-num-seqs": 4}},
                "frontend": {
                    "component": "components/frontend.py",
                    "flags": {"http-port": 8000, "router-policy": policy},
                    "depends_on": ["short"],
                },
            },
        }
    )


@pytest.mark.processes
@pytest.mark.parametrize("named", [False, True], ids=["one-of-its-kind", "FILE:NAME"])
def test_a_graph_names_the_notebook_as_worker_and_its_policy(
    notebook: Path, tmp_path: Path, named: bool
) -> None:
    worker, policy = (f"{notebook}:worker", f"{notebook}:policy") if named else (str(notebook), str(notebook))
    text = graph_yaml(notebook, worker, policy)
    commands = check_graph(Graph.from_yaml(text), cwd=ROOT)
    [short] = [c for c in commands if c.service == "short"]
    assert short.program.suffix == ".py" and short.notebook == notebook
    assert short.argv[-2:] == ["--max-num-seqs", "4"]
    (tmp_path / "short.yaml").write_text(text)
    dry = subprocess.run(
        [sys.executable, "-m", "dynamo_nb", "serve", str(tmp_path / "short.yaml"), "--dry-run"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    assert f"--router-policy {policy}" in dry.stdout
    # the export's program absolute (it can be pasted); a path is never shown climbing twice (a
    # notebook one level up, as pytest's tmp folder beside a checkout in /tmp, is shown ../x)
    assert f"python3 {short.program} " in dry.stdout and "../../" not in dry.stdout


@pytest.mark.processes
def test_a_router_policy_that_is_not_there_fails_before_anything_starts(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "components/frontend.py", "--discovery", "etcd://127.0.0.1:1", "--router-policy", "nowhere.ipynb:policy"],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("error: --router-policy nowhere.ipynb:policy: nowhere.ipynb not found (looked in")
    assert "give an absolute path, or one relative to the working folder" in line


async def ask(url: str, prompt: str) -> dict:
    """A greedy completion, with the worker that served it (``nvext.worker_id``)."""
    body = {
        "model": "short",
        "prompt": prompt,
        "max_tokens": 20,
        "temperature": 0,
        "nvext": {"extra_fields": ["worker_id"]},
    }
    async with httpx.AsyncClient(timeout=120) as client:
        answer = await client.post(f"{url}/v1/completions", json=body)
    assert answer.status_code == 200, answer.text
    return answer.json()


@pytest.mark.processes
async def test_the_notebook_serves_behind_the_frontend_routed_by_its_own_policy(
    notebook: Path, services: LocalServices, tmp_path: Path
) -> None:
    """Two replicas of the notebook's worker (``FILE:NAME``), a frontend routing with the same
    notebook's policy (``FILE``, the one of its kind): answers end after three tokens (the
    subclass), long prompts go to one replica and short ones to the other (the policy)."""
    etcd = ["--discovery", str(services.etcd_url)]
    started = []
    try:
        for _ in range(2):
            started.append(
                await launch(f"{notebook}:worker", *etcd, log_dir=tmp_path, show_logs=False, timeout=120)
            )
        front = await launch(
            "components/frontend.py", *etcd, "--http-port", 0, "--router-policy", str(notebook),
            cwd=ROOT, log_dir=tmp_path, show_logs=False,
        )  # fmt: skip
        started.append(front)
        await bench.wait_for_model(front.url, "short", instances=2, timeout=60)
        low, high = sorted(worker.instance_id for worker in started[:2])
        for prompt, expected in (("hello there", low), ("tell me a story " * 12, high), ("hi", low)):
            answer = await ask(front.url, prompt)
            assert answer["usage"]["completion_tokens"] == 3, answer  # the subclass ended it
            assert answer["choices"][0]["finish_reason"] == "stop", answer
            assert answer["nvext"]["worker_id"]["decode_worker_id"] == expected, (prompt, answer["nvext"])
    finally:
        for process in reversed(started):
            await process.stop()


@pytest.mark.processes
@pytest.mark.long  # four processes on 2 cores: CI's second step runs it (-m long)
async def test_the_subclass_holds_as_a_prefill_and_decode_pair(
    notebook: Path, services: LocalServices, tmp_path: Path
) -> None:
    """The same notebook as ``--mode prefill`` + ``--mode decode`` (the decode runs the subclass's
    ``decode``): the same three-token greedy text as the notebook's aggregated worker."""
    etcd = ["--discovery", str(services.etcd_url)]
    started = []
    try:
        for flags in (
            ["--model-name", "short-agg", "--endpoint", "dynamo.agg.generate"],
            ["--mode", "prefill"],
            ["--mode", "decode"],
        ):
            started.append(
                await launch(notebook, *etcd, *flags, log_dir=tmp_path, show_logs=False, timeout=120)
            )
        front = await launch(
            "components/frontend.py", *etcd, "--http-port", 0, cwd=ROOT, log_dir=tmp_path, show_logs=False
        )
        started.append(front)
        await bench.wait_for_model(front.url, "short", instances=1, timeout=60)
        await bench.wait_for_model(front.url, "short-agg", instances=1, timeout=60)
        prompt = "the frontend and the workers"
        async with httpx.AsyncClient(timeout=120) as client:
            texts = {}
            for model in ("short-agg", "short"):
                body = {"model": model, "prompt": prompt, "max_tokens": 20, "temperature": 0,
                        "nvext": {"extra_fields": ["worker_id"]}}  # fmt: skip
                answer = (await client.post(f"{front.url}/v1/completions", json=body)).json()
                assert answer["usage"]["completion_tokens"] == 3, answer
                texts[model] = answer["choices"][0]["text"]
                if model == "short":  # the disaggregated path ran: a prefill worker took part
                    assert answer["nvext"]["worker_id"]["prefill_worker_id"] == started[1].instance_id, answer
        assert texts["short"] == texts["short-agg"], texts
    finally:
        for process in reversed(started):
            await process.stop()


async def test_the_engine_written_from_scratch_in_the_docs_conforms() -> None:
    """docs/your-own-component.md's first example, run as written, passes the conformance suite."""
    from dynamo_nb.engines import check_engine

    page = (ROOT / "docs" / "your-own-component.md").read_text()
    code = page.split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict = {}
    exec(compile(code, "docs/your-own-component.md", "exec"), namespace)
    report = await check_engine(namespace["Reverse"]())
    assert report.passed, report


# ----------------------------------------------------------------------------- errors that say what to change


async def test_an_engine_yielding_dicts_is_told_to_yield_llm_engine_outputs() -> None:
    from dynamo_nb.engines import check_engine

    class Dicts(EchoEngine):
        async def generate(self, request, context=None):
            yield {"token_ids": [1], "finish_reason": "stop"}

    report = await check_engine(Dicts())
    assert not report.passed
    failed = [row.detail for row in report.results if row.status == "failed"]
    assert any(
        "generate yielded a dict" in detail and "LLMEngineOutput.final(...)" in detail for detail in failed
    ), failed


async def test_a_wrapper_that_speaks_before_its_inner_engine_refuses_is_told_to_take_the_first_item() -> None:
    """A wrapper yielding its own item before reading the inner stream: the inner engine's refusal
    of a too-long prompt comes after output, too late for a 400; the check says what to change,
    and the same wrapper taking the first item first passes it."""
    from dynamo_nb.engines import check_engine
    from dynamo_nb.llm import LLMEngineOutput

    class SpeaksFirst(EchoEngine):
        async def generate(self, request, context=None):
            yield LLMEngineOutput(token_ids=[7])
            async for item in super().generate(request, context):
                yield item

    class TakesTheFirstItem(EchoEngine):
        async def generate(self, request, context=None):
            stream = super().generate(request, context)
            first = await anext(stream)  # the inner engine refuses here
            yield LLMEngineOutput(token_ids=[7])
            yield first
            async for item in stream:
                yield item

    row = "a prompt past the context is refused"
    report = await check_engine(SpeaksFirst(context_length=64))
    detail = next(result.detail for result in report.results if result.name == row)
    assert "refused only after 1 item(s) of output" in detail and "await anext(stream)" in detail, report
    fixed = await check_engine(TakesTheFirstItem(context_length=64))
    assert next(result.status for result in fixed.results if result.name == row) == "passed", fixed


async def test_an_engine_that_needs_a_temperature_is_told_a_client_may_send_none() -> None:
    """A client that sends no temperature gets SamplingOptions(temperature=None): an engine that
    divides by it fails the contract's check, which says to sample at 1 then."""
    from dynamo_nb.engines import check_engine

    class NeedsTemperature(EchoEngine):
        async def generate(self, request, context=None):
            temperature = request.sampling_options.temperature
            _scale = 1.0 / temperature if temperature != 0 else None  # None: a TypeError, as `logits / None`
            async for item in super().generate(request, context):
                yield item

    report = await check_engine(NeedsTemperature())
    failed = {row.name: row.detail for row in report.results if row.status == "failed"}
    assert list(failed) == ["a request without sampling options streams (temperature None is 1)"], report
    assert "TypeError" in failed[next(iter(failed))], failed


@pytest.mark.parametrize("mode", ["prefill", "decode"])
async def test_an_engine_without_prefill_and_decode_is_told_so_for_a_disaggregated_mode(mode: str) -> None:
    """A worker started with --mode prefill or decode around an engine with only `generate`
    (as a first engine is) stops with what to implement or which mode to use."""
    from dynamo_nb import DistributedRuntime
    from dynamo_nb.disagg import WorkerRole
    from dynamo_nb.errors import ConfigError

    async with await DistributedRuntime.create() as runtime:
        with pytest.raises(
            ConfigError, match=f"--mode {mode}: EchoEngine has no prefill and decode roles.*--mode aggregated"
        ):
            await WorkerRole(mode, "byo.worker.generate").method(runtime, EchoEngine())
        method, _ = await WorkerRole("aggregated", "byo.worker.generate").method(runtime, EchoEngine())
        assert method.__name__ == "generate"


async def test_a_policy_reading_the_request_as_a_dict_is_told_its_type_and_hex_ids_are_taken() -> None:
    from dynamo_nb import DistributedRuntime
    from dynamo_nb.errors import RoutingError
    from dynamo_nb.llm import PreprocessedRequest
    from dynamo_nb.router.function import FunctionRouter

    async def echo(request, context=None):
        yield {"echo": request}

    async with await DistributedRuntime.create() as runtime:
        server = await runtime.endpoint("byo.policy.generate").serve(echo)
        client = await runtime.endpoint("byo.policy.generate").client()
        await client.wait_for_instances(timeout=10)
        request = PreprocessedRequest(token_ids=[1, 2, 3])

        def as_dict(request, instance_ids):
            return instance_ids[0] if len(request["token_ids"]) > 2 else instance_ids[-1]

        with pytest.raises(
            RoutingError,
            match=r"is a PreprocessedRequest, not a dict; read its attributes \(request.token_ids",
        ):
            FunctionRouter(client, as_dict).pick(request)
        hex_id = f"{server.instance_id:x}"  # as READY lines and /health show it
        assert (
            FunctionRouter(client, lambda request, ids: hex_id).pick(request).instance_id
            == server.instance_id
        )


def test_a_flag_typo_on_the_command_line_gets_the_close_flags() -> None:
    import contextlib
    import io

    from dynamo_nb.flags import hf_worker_parser

    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit):
        hf_worker_parser().parse_args(["--max-num-sequences", "4"])
    assert (
        err.getvalue()
        .splitlines()[-1]
        .endswith(
            "unrecognized arguments: --max-num-sequences 4 (--max-num-sequences: did you mean "
            "--max-num-seqs or --max-num-batched-tokens?)"
        )
    )


@pytest.mark.processes
async def test_the_frontend_logs_its_shutdown_under_its_own_name(tmp_path: Path) -> None:
    front = await launch(
        "components/frontend.py", "--discovery", f"file://{tmp_path / 'discovery'}", "--http-port", 0,
        cwd=ROOT, log_dir=tmp_path, show_logs=False,
    )  # fmt: skip
    assert await front.stop() == 0
    assert any(" frontend: received SIGTERM; shutting down" in line for line in front.logs()), front.tail()


@pytest.mark.processes
def test_your_own_image_holds_the_notebook_and_the_manifests_run_it(notebook: Path, tmp_path: Path) -> None:
    """``--emit k8s --image NAME --build-context DIR``: DIR holds a Dockerfile on the kit's image
    with the notebook (worker and policy) at the path the graph names, and the schema-valid
    manifests run that image: the init container exports the notebook, the frontend loads its policy."""
    kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="pip install -e '.[dev]'")
    (tmp_path / "short.yaml").write_text(graph_yaml(notebook, "short.ipynb:worker", "short.ipynb:policy"))
    serve = [sys.executable, "-m", "dynamo_nb", "serve", "short.yaml", "--emit", "k8s"]
    done = subprocess.run(
        [*serve, "--image", "registry.example/short:1", "--build-context", "image"],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "wrote image: docker build -t registry.example/short:1 image" in done.stderr
    assert (tmp_path / "image" / "Dockerfile").read_text().splitlines()[1:] == [
        "FROM dynamo-nb:0.1.0",
        "WORKDIR /app",
        "COPY short.ipynb /app/short.ipynb",  # the worker's file and the policy's: one file, copied once
    ]
    assert (tmp_path / "image" / "short.ipynb").read_bytes() == notebook.read_bytes()
    manifests = list(yaml.safe_load_all(done.stdout))
    for manifest in manifests:
        kubernetes_validate.validate(manifest, "1.33", strict=True)
    pods = {
        m["metadata"]["name"]: m["spec"]["template"]["spec"] for m in manifests if m["kind"] == "Deployment"
    }
    worker, frontend = pods["short-short"], pods["short-frontend"]
    assert (
        worker["containers"][0]["image"] == frontend["containers"][0]["image"] == "registry.example/short:1"
    )
    assert worker["initContainers"][0]["command"][-3:] == ["short.ipynb", "--output-dir", "/exported"]
    assert worker["containers"][0]["command"] == ["python3", "/exported/short.py"]
    args = frontend["containers"][0]["args"]
    assert args[args.index("--router-policy") + 1] == "short.ipynb:policy"
    unnamed = subprocess.run(
        [*serve, "--build-context", "image"], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert unnamed.returncode == 2 and "name it with --image" in unnamed.stderr


def test_declarations_written_other_ways_are_found_by_name_and_by_kind(tmp_path: Path) -> None:
    """An annotated declaration, a decorated function and a second name for one policy: each
    found (``FILE:NAME`` loads what the module holds under that name)."""
    source = (
        "from dynamo_nb import RoutingPolicy\n"
        "def pick(request, ids):\n    return ids[0]\n"
        "policy: RoutingPolicy = RoutingPolicy(pick)\n"
        "first = policy\n"
        "@RoutingPolicy\ndef last(request, ids):\n    return ids[-1]\n"
        "_private = RoutingPolicy(pick)\n"
    )
    assert declarations(source, "p.py") == {"policy": "routing policy", "last": "routing policy"}
    (tmp_path / "p.py").write_text(source)
    assert load_component(f"{tmp_path / 'p.py'}:first", runnable=False)(None, [3, 5]) == 3
    assert load_component(f"{tmp_path / 'p.py'}:last", runnable=False)(None, [3, 5]) == 5
    with pytest.raises(ConfigError, match=r"declares 2 of the kind wanted here \(policy .*, last"):
        load_component(str(tmp_path / "p.py"), runnable=False)


@pytest.mark.processes
def test_ipython_lines_in_a_kept_cell_are_not_refused_and_export_as_calls(tmp_path: Path) -> None:
    path = write_unrun_notebook(tmp_path / "shell.ipynb", "for name in ['a']:\n    !echo $name\n%env X=1")
    check_exported_cells(path)  # indented, and a line magic: the export turns both into calls
    exported = export_notebook(path).read_text()
    assert "get_ipython().system" in exported and "get_ipython().run_line_magic" in exported


async def test_a_policy_returning_what_is_no_instance_is_told_what_it_returned() -> None:
    from dynamo_nb import DistributedRuntime
    from dynamo_nb.errors import RoutingError
    from dynamo_nb.llm import PreprocessedRequest
    from dynamo_nb.router.function import FunctionRouter

    async def echo(request, context=None):
        yield {"echo": request}

    async with await DistributedRuntime.create() as runtime:
        await runtime.endpoint("byo.wrong.generate").serve(echo)
        client = await runtime.endpoint("byo.wrong.generate").client()
        await client.wait_for_instances(timeout=10)
        with pytest.raises(
            RoutingError,
            match=r"returned 'zz', not one of the instances \['[0-9a-f]+'\] \(an int, or its hex",
        ):
            FunctionRouter(client, lambda request, ids: "zz").pick(PreprocessedRequest(token_ids=[1]))
