"""How a client call becomes a request and its answer a result, apart from sending it.

A ``Call`` describes one API request (method, path, body, how to read the answer); the helpers
build request models from what the caller passed and refuse bad arguments as the service would.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, Protocol, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, TypeAdapter, ValidationError

from service.client.errors import MemoriaAPIError
from service.queue.schemas import JobInfo
from service.recall.schemas import ToolResult

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)


class BinaryWriter(Protocol):
    """Where an export is streamed: an open binary file, ``io.BytesIO()``, a socket file…"""

    def write(self, data: bytes, /) -> object: ...


@dataclass(frozen=True)
class Call(Generic[T]):
    """One API request, described independently of how (async or sync) it is sent."""

    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    params: dict[str, Any] | None = None
    body: Any = None
    headers: dict[str, str] | None = None
    sink: BinaryWriter | None = None  # stream the answer's bytes here instead of parsing
    recover: Callable[[MemoriaAPIError], T] | None = None  # an error turned into a result


def as_request(
    model: type[M], request: BaseModel | Mapping[str, Any] | None, fields: Mapping[str, Any]
) -> M:
    """The request model from a model, a mapping and/or keyword fields (the latter win)."""
    if isinstance(request, model) and not fields:
        return request
    data: dict[str, Any] = {}
    if isinstance(request, BaseModel):
        # Another model (a turn's ContextRequest passed to ``end``) gives what they share: the
        # service refuses fields it does not know.
        dumped = request.model_dump(exclude_unset=True)
        data.update(dumped if isinstance(request, model) else _known(model, dumped))
    elif request is not None:
        data.update(request)
    data.update(fields)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise _refused(model, exc) from None


def _refused(model: type[BaseModel], exc: ValidationError) -> MemoriaAPIError:
    """A request model's validation error as the service's 422, naming the first bad field."""
    problems = []
    for error in exc.errors(include_url=False, include_input=False):
        message = str(error["msg"]).removeprefix("Value error, ")
        field = ".".join(str(part) for part in error["loc"])
        if not field:
            # A rule across fields ("group_id is required when …") names its field first.
            first_word = message.split(" ", 1)[0]
            field = first_word if first_word in model.model_fields else "body"
        problems.append({"field": field, "message": message})
    first = problems[0] if problems else {"field": "body", "message": str(exc)}
    field, message = first["field"], first["message"]
    said = message if message.startswith(field) else f"{field}: {message}"
    return MemoriaAPIError.invalid(field, said, problems)


def _known(model: type[BaseModel], data: dict[str, Any]) -> dict[str, Any]:
    names = set(model.model_fields)
    names |= {f.alias for f in model.model_fields.values() if f.alias}
    return {k: v for k, v in data.items() if k in names}


def json_body(model: BaseModel, *keep: str) -> dict[str, Any]:
    """The fields the caller set (a PATCH must not send the others), plus ``keep``."""
    body = model.model_dump(mode="json", exclude_unset=True)
    for name in keep:
        body[name] = getattr(model, name)
    return body


def parse_one(model: type[M]) -> Callable[[httpx.Response], M]:
    """A reader of an answer that is one ``model``."""
    return lambda response: model.model_validate_json(response.content)


def parse_many(model: type[M]) -> Callable[[httpx.Response], list[M]]:
    """A reader of an answer that is a list of ``model``."""
    adapter = TypeAdapter(list[model])  # type: ignore[valid-type]
    return lambda response: list(adapter.validate_json(response.content))


def parse_dict(response: httpx.Response) -> dict[str, Any]:
    """An answer as a dict (a bare value as ``{"result": value}``)."""
    body = response.json()
    return dict(body) if isinstance(body, dict) else {"result": body}


def parse_nothing(response: httpx.Response) -> None:
    """An answer without a body (204): nothing to read."""


def query_params(**values: Any) -> dict[str, Any]:
    """Query parameters, without the unset ones (booleans as the API spells them)."""
    out: dict[str, Any] = {}
    for name, value in values.items():
        if value is None:
            continue
        if isinstance(value, bool):
            value = "true" if value else "false"
        elif isinstance(value, datetime):
            value = value.isoformat()
        out[name] = value
    return out


def row_id(value: object, field: str) -> int:
    """A row id argument as the integer the path needs (a bad one refused like the service)."""
    try:
        number: int = int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        raise MemoriaAPIError.invalid(field, f"{field}: not an integer id: {value!r}") from None
    if number < 1:
        raise MemoriaAPIError.invalid(field, f"{field}: ids start at 1")
    return number


def segment(value: object) -> str:
    """One path segment, escaped (ids are the bot's, and may hold anything)."""
    escaped = quote(str(value), safe="")
    # A bare '.' or '..' would be resolved as a path's own, before the request is sent.
    return escaped.replace(".", "%2E") if escaped in (".", "..") else escaped


def profile_path(entity_type: str, entity_id: str, group_id: str | None) -> str:
    """The path of one profile (a member profile is under its group)."""
    if entity_type == "member":
        if not group_id:
            raise MemoriaAPIError.invalid("group_id", "group_id: a member profile needs group_id")
        return f"/v1/profiles/member/{segment(group_id)}/{segment(entity_id)}"
    return f"/v1/profiles/{segment(entity_type)}/{segment(entity_id)}"


def context_dict(context: BaseModel | Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A conversation context as the JSON object a tool call sends."""
    if context is None:
        return None
    if isinstance(context, BaseModel):
        return context.model_dump(mode="json", exclude_none=True)
    return dict(context)


def tool_arguments(value: Any) -> Any:
    """A tool call's arguments as sent: the model's JSON text as is (the service parses and
    judges it), a mapping as a dict."""
    if value is None:
        return {}
    return dict(value) if isinstance(value, Mapping) else value


def tool_call_parts(tool_call: Any) -> tuple[str, Any]:
    """(name, arguments) of an OpenAI tool call: an SDK object or a dict of the same shape."""
    function = tool_call.get("function") if isinstance(tool_call, Mapping) else None
    if function is None and not isinstance(tool_call, Mapping):
        function = getattr(tool_call, "function", None)
    if function is None:  # a Responses API function_call item names them directly
        function = tool_call
    if isinstance(function, Mapping):
        name, arguments = function.get("name"), function.get("arguments")
    else:
        name, arguments = getattr(function, "name", None), getattr(function, "arguments", None)
    if not name:
        raise MemoriaAPIError.invalid("tool_call", "not a tool call: no function name")
    return str(name), arguments


def parse_tool_content(response: httpx.Response) -> str:
    """The content of a tool result, for the model."""
    return ToolResult.model_validate_json(response.content).content


def parse_streamed(response: httpx.Response) -> int:
    """The reader of a streamed call: never called, a call with a sink returns the bytes it
    wrote."""
    return 0


def job_call(job_id: int) -> Call[JobInfo]:
    """The request for one job (``get_job``, and each poll of a job wait)."""
    return Call("GET", f"/v1/jobs/{row_id(job_id, 'job_id')}", parse_one(JobInfo))
