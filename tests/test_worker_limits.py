"""Workers check what they are sent: a request that reaches a worker's request-plane port
without the frontend (a client of the endpoint, a stranger) is refused at once when it breaks
the model's vocabulary or context — before any compute, with the same typed error the frontend
would give (a million-token prompt sent straight to a prefill worker used to run for minutes). The
sampling and stop checks are the protocol's own (`dynamo_nb.llm.protocol`), shared with the frontend."""

from __future__ import annotations

from typing import Any

import pytest
from helpers import MOCKER_WORKER, RuntimeFactory, collect

from dynamo_nb.errors import RemoteHandlerError
from dynamo_nb.llm import PreprocessedRequest, RequestLimits, StopConditions


def test_the_limits_name_the_field_and_the_fix() -> None:
    limits = RequestLimits(context_length=16, vocab_size=100)
    limits.check(PreprocessedRequest(token_ids=[1] * 6, stop_conditions=StopConditions(max_tokens=10)))
    cases = [
        ([1, 100], None, "token_ids", "outside the vocabulary (100 tokens)"),
        ([1] * 16, None, "token_ids", "the prompt is 16 tokens and the model has a context of 16"),
        ([1] * 6, 11, "max_tokens", "lower max_tokens to at most 10"),
    ]
    for tokens, max_tokens, param, says in cases:
        with pytest.raises(Exception) as refused:
            limits.check(
                PreprocessedRequest(token_ids=tokens, stop_conditions=StopConditions(max_tokens=max_tokens))
            )
        assert refused.value.param == param and says in str(refused.value)  # type: ignore[attr-defined]
    RequestLimits().check(PreprocessedRequest(token_ids=[10**9] * 5000))  # nothing known: nothing refused


@pytest.mark.parametrize("mode", ["prefill", "aggregated"])
async def test_a_worker_refuses_what_the_frontend_would_before_any_compute(
    services: Any, start_worker: Any, make_runtime: RuntimeFactory, mode: str
) -> None:
    endpoint = "limits.prefill.generate" if mode == "prefill" else "limits.backend.generate"
    await start_worker(
        "--discovery", services.etcd_url, "--mode", mode, "--endpoint", "limits.backend.generate",
        "--prefill-endpoint", "limits.prefill.generate", "--speedup-ratio", "1", script=MOCKER_WORKER,
    )  # fmt: skip
    runtime = await make_runtime("etcd-tcp")
    client = await runtime.endpoint(endpoint).client()
    await client.wait_for_instances(timeout=10)
    stop = {"max_tokens": 1 if mode == "prefill" else 4}
    refused = {
        "a million-token prompt": ({"token_ids": [5] * 1_000_000, "stop_conditions": stop}, "token_ids", "has a context of 1024"),
        "a token past the vocabulary": ({"token_ids": [5, 10**6], "stop_conditions": stop}, "token_ids", "vocabulary"),
        "max_tokens past the context": (
            {"token_ids": [5] * 100, "stop_conditions": {"max_tokens": 1000}}, "max_tokens", "at most 924",
        ),
        "five stop strings": (
            {"token_ids": [5], "stop_conditions": {**stop, "stop": ["a", "b", "c", "d", "e"]}}, "stop", "at most 4",
        ),
        "min_tokens over max_tokens": (
            {"token_ids": [5], "stop_conditions": {"max_tokens": 1, "min_tokens": 3}}, "min_tokens", "lower min_tokens",
        ),
        "an empty stop string": (
            {"token_ids": [5], "stop_conditions": {**stop, "stop": [""]}}, "stop", "non-empty",
        ),
        "a temperature out of range": (
            {"token_ids": [5], "stop_conditions": stop, "sampling_options": {"temperature": 5}}, "temperature", "between 0 and 2",
        ),
    }  # fmt: skip
    for what, (request, param, says) in refused.items():
        with pytest.raises(RemoteHandlerError) as error:
            await collect(client.round_robin(request))
        assert error.value.error_type == "InvalidRequestError", what
        assert error.value.http_status == 400 and says in error.value.remote_message, (what, error.value)
        assert error.value.param == param, what
    served = await collect(client.round_robin({"token_ids": [5] * 100, "stop_conditions": stop}))
    assert served and served[-1]["finish_reason"] in ("length", "stop")  # and it keeps serving
