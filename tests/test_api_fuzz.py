"""A bounded schemathesis run against the embedded default's own /openapi.json.

Every operation the document lists gets a fixed number of generated requests (derandomized, so a
run is repeatable). None may answer 5xx; every 4xx is JSON in the OpenAI error shape; the
server is healthy afterwards. Replies are capped at a few tokens so the run stays short: a
generated max_tokens above the cap (or none) is replaced by the cap, the only change made to
what the fuzzer sends.
"""

from __future__ import annotations

import os

import httpx
import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402

EXAMPLES = int(os.environ.get("PB_TEST_FUZZ_EXAMPLES", "50"))
TOKEN_CAP = 4
# Each generation route's length fields: the first is always set, the others capped when sent.
LENGTH_FIELDS = {"/v1/chat/completions": ("max_tokens", "max_completion_tokens"), "/v1/completions": ("max_tokens",),
                 "/v1/responses": ("max_output_tokens",)}


def test_fuzzing_the_openapi_document_finds_no_server_error(server_on):
    schema = schemathesis.openapi.from_url(f"{server_on.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    labels = {op.label for op in operations}
    assert {"POST /v1/chat/completions", "POST /v1/completions", "POST /v1/responses"} <= labels, labels
    statuses: dict[str, list[int]] = {}
    problems: list[str] = []

    def fuzz(op) -> None:
        @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate])
        @given(case=op.as_strategy())
        def run(case):
            fields = LENGTH_FIELDS.get(op.path, ())
            if isinstance(case.body, dict):
                for i, field in enumerate(fields):
                    value = case.body.get(field)
                    if (i == 0 or field in case.body) and (
                            not isinstance(value, int) or isinstance(value, bool) or value > TOKEN_CAP):
                        case.body[field] = TOKEN_CAP
            response = case.call(timeout=120)
            statuses.setdefault(op.label, []).append(response.status_code)
            if response.status_code >= 500:
                problems.append(f"{op.label} {response.status_code}: {response.text[:200]} <- {str(case.body)[:200]}")
            elif response.status_code >= 400:
                try:
                    error = response.json().get("error")
                except ValueError:
                    error = None
                if not isinstance(error, dict) or set(error) != {"message", "type", "param", "code"}:
                    problems.append(f"{op.label} {response.status_code} not in the OpenAI shape: {response.text[:200]}")

        run()

    for op in operations:
        fuzz(op)
    assert not problems, "\n".join(problems[:20])
    chat = statuses["POST /v1/chat/completions"]
    assert any(s == 200 for s in chat) and any(400 <= s < 500 for s in chat), chat  # both kinds were reached
    health = httpx.get(f"{server_on.url}/health", timeout=10)
    assert health.status_code == 200 and health.json()["requests"] == {"running": 0, "waiting": 0}, health.text
