"""PB_API_ERRORS: typed request bodies for the OpenAI routes.

Upstream's routes take `body: dict`, so a field of the wrong type (`"temperature": "hot"`,
`"seed": "abc"`, `"tools": 5`) reached the engine and came back as a plain-text 500, and
/openapi.json described every body as a free-form object. These models type the fields the
server reads; FastAPI checks a body against them before the handler runs, and errors.py answers
a mismatch with a 400 naming the field. Scalars are strict (no "5" for 5, no 1 for true).
Unknown fields are let through (`extra="allow"`): upstream's and patchbay's own checks decide
about them, as before. The handler is then given the body exactly as the client sent it.
"""

from typing import Annotated, Any, Literal, Union

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, StringConstraints, model_validator

from .. import knobs

SEED = Annotated[StrictInt, Field(ge=-(2**63), lt=2**64, description="a 64-bit integer")]
MAX_TOKENS = Annotated[StrictInt, Field(ge=1)]
Number = Union[StrictInt, StrictFloat]
TEMPERATURE = Annotated[Number, Field(ge=0)]
TOP_P = Annotated[Number, Field(gt=0, le=1)]
PENALTY = Annotated[Number, Field(ge=-2, le=2)]
TOKEN_ID = Annotated[StrictStr, StringConstraints(pattern=r"^[0-9]{1,10}$")]  # a token id, as a JSON key
STOP = Union[StrictStr, Annotated[list[StrictStr], Field(max_length=16)], None]


def _generation_config(value):
    """Upstream builds a GenerationConfig from this JSON text: refuse what it cannot build."""
    import json

    try:
        parsed = json.loads(value)
    except ValueError as e:
        raise ValueError(f"must be a JSON object of generation settings ({e})") from None
    if not isinstance(parsed, dict):
        raise ValueError("must be a JSON object of generation settings")
    from transformers import GenerationConfig

    try:
        GenerationConfig(**parsed).validate()
    except Exception as e:  # what GenerationConfig raises for a bad setting varies
        raise ValueError(f"is not a valid generation config ({e})") from None
    return value


GENERATION_CONFIG = Annotated[StrictStr, AfterValidator(_generation_config)]


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class _Body(BaseModel):
    # Unknown top-level fields are refused by name (upstream's check, answered 400 `unknown_field`),
    # so the document says so; validation still lets them through to that check.
    model_config = ConfigDict(extra="allow", json_schema_extra={"additionalProperties": False})


class TextPart(_Open):
    type: StrictStr
    text: StrictStr | None = None


class FunctionCall(_Open):
    name: StrictStr
    arguments: StrictStr | dict[str, Any] | None = None


class ToolCall(_Open):
    id: StrictStr | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(_Open):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: StrictStr | list[TextPart] | None = None
    name: StrictStr | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: StrictStr | None = None
    reasoning_content: StrictStr | None = None
    reasoning: StrictStr | None = None


class FunctionDefinition(_Open):
    name: StrictStr
    description: StrictStr | None = None
    parameters: dict[str, Any] | None = None
    strict: StrictBool | None = None


class Tool(_Open):
    type: Literal["function"]
    function: FunctionDefinition


class ResponseFormat(_Open):
    # Its values are checked by 0130 (structured output), which names what is allowed.
    type: StrictStr
    json_schema: dict[str, Any] | None = None


class StreamOptions(_Open):
    include_usage: StrictBool | None = None


class _Sampling(_Body):
    model: StrictStr | None = None
    max_tokens: MAX_TOKENS | None = None
    temperature: TEMPERATURE | None = None
    top_p: TOP_P | None = None
    seed: SEED | None = None
    stop: STOP = None
    stream: StrictBool | None = None
    stream_options: StreamOptions | None = None
    n: Annotated[StrictInt, Field(ge=1, le=128)] | None = None
    presence_penalty: PENALTY | None = None
    frequency_penalty: PENALTY | None = None
    logit_bias: dict[TOKEN_ID, Annotated[Number, Field(ge=-100, le=100)]] | None = None
    user: StrictStr | None = None
    generation_config: GENERATION_CONFIG | None = None
    pb_knobs: dict[StrictStr, Any] | None = None


class ChatCompletionRequest(_Sampling):
    messages: Annotated[list[Message], Field(min_length=1)]
    max_completion_tokens: MAX_TOKENS | None = None
    tools: list[Tool] | None = None
    tool_choice: StrictStr | dict[str, Any] | None = None  # its values: 0140's check
    parallel_tool_calls: StrictBool | None = None
    response_format: ResponseFormat | None = None
    logprobs: StrictBool | None = None
    top_logprobs: Annotated[StrictInt, Field(ge=0, le=20)] | None = None
    top_k: StrictInt | None = None
    min_p: Annotated[Number, Field(ge=0, le=1)] | None = None
    chat_template_kwargs: dict[StrictStr, Any] = None  # not null: upstream merges it into a dict
    # GLM's thinking switches (0070) and the vLLM-style grammar fields (0130), checked there.
    reasoning_effort: StrictStr | None = None
    thinking: dict[str, Any] | StrictBool | None = None
    guided_json: Any = None  # these five: 0130 checks them and names what it accepts
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    structured_outputs: Any = None


class CompletionRequest(_Sampling):
    prompt: StrictStr | list[StrictInt] | None = None
    suffix: StrictStr | None = None
    echo: StrictBool | None = None
    logprobs: Annotated[StrictInt, Field(ge=0, le=5)] | None = None
    best_of: Annotated[StrictInt, Field(ge=1, le=128)] | None = None


class CompletionsRequest(CompletionRequest):
    """PB_COMPLETIONS: every prompt form of OpenAI's API (a string, strings, token ids, lists of them)."""
    prompt: StrictStr | list[StrictStr] | list[StrictInt] | list[list[StrictInt]] | None = None


class ContentPart(_Open):
    type: StrictStr


class ResponseInputItem(_Open):
    """A message (`role`), a content part or a tool-call item (`type`): upstream reads one of the two."""
    role: Literal["system", "developer", "user", "assistant", "tool"] | None = None
    type: StrictStr | None = None
    content: StrictStr | list[ContentPart] | None = None

    @model_validator(mode="after")
    def _role_or_type(self):
        if self.role is None and self.type is None:
            raise ValueError("an input item needs a 'role' (a message) or a 'type' (a content part or tool item)")
        return self


class ResponsesRequest(_Body):
    model: StrictStr | None = None
    input: Annotated[StrictStr, Field(min_length=1)] | Annotated[list[ResponseInputItem], Field(min_length=1)]
    instructions: StrictStr | None = None
    max_output_tokens: MAX_TOKENS | None = None
    temperature: TEMPERATURE | None = None
    top_p: TOP_P | None = None
    seed: SEED | None = None
    stream: StrictBool | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: StrictStr | dict[str, Any] | None = None
    parallel_tool_calls: StrictBool = None  # not null: upstream copies it into its Response object
    generation_config: GENERATION_CONFIG | None = None
    pb_knobs: dict[StrictStr, Any] | None = None


ROUTES = {"/v1/chat/completions": ("chat", ChatCompletionRequest),
          "/v1/completions": ("completion", CompletionRequest),
          "/v1/responses": ("response", ResponsesRequest)}


def install(app, handlers: dict) -> None:
    """Typed routes for the OpenAI paths, added before upstream's so they take precedence; each
    hands the body as sent to upstream's handler of that path."""
    from fastapi import Request

    for path, (name, model) in ROUTES.items():
        handler = handlers.get(name)
        if handler is None:
            continue
        if model is CompletionRequest and knobs.get("PB_COMPLETIONS"):
            model = CompletionsRequest
        app.post(path, name=f"pb_{name}")(_route(handler, model, Request))
    app.post("/v1/audio/transcriptions", name="pb_transcriptions")(_transcriptions(handlers.get("transcription"),
                                                                                   Request))
    app.openapi = lambda: _openapi(app)


def _transcriptions(handler, Request):
    """Upstream's transcription route, or a 400 saying why this server cannot transcribe (it
    raised ImportError, a 500, for every call when python-multipart is missing)."""
    import importlib.util

    from . import errors

    available = handler is not None and importlib.util.find_spec("python_multipart") is not None

    async def route(request: Request):
        if not available:
            return errors.response(400, "audio transcription is not available on this server (the python-multipart "
                                   "package is not installed)", "route_unavailable")
        return await handler.handle_request(request)

    return route


def _openapi(app) -> dict:
    """The OpenAPI document of the routes that answer: for a path and method served twice (a
    typed route here, upstream's after it), the first, which is the one requests reach."""
    from fastapi.openapi.utils import get_openapi

    if app.openapi_schema is None:
        seen, routes = set(), []
        for route in app.routes:
            key = (getattr(route, "path", None), frozenset(getattr(route, "methods", None) or ()))
            if key not in seen:
                seen.add(key)
                routes.append(route)
        app.openapi_schema = get_openapi(title=app.title, version=app.version, routes=routes)
    return app.openapi_schema


def _route(handler, model, Request):
    async def route(request: Request, body: model):  # noqa: ARG001 - validated by FastAPI, not read
        raw = await request.json()
        return await handler.handle_request(raw, request.state.request_id)

    return route
