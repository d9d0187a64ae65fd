"""Which tools the simulated model calls, and with what arguments: pure functions of the request.

``tool_choice`` decides first: ``"none"`` never calls, ``"required"`` always calls, a named
function calls that one. With ``"auto"`` the model calls a tool when the last user message asks
for one: it names the tool (``get_weather``, or "get weather"), uses the significant words of its
description, or asks to "use the tool" / "call" one. With ``parallel_tool_calls`` every tool the
message names is called, in the order the message names them. Arguments are generated from the
function's JSON schema, with string, number and enum values taken from the prompt where it gives
them (``"weather in Paris"`` -> ``{"city": "Paris"}``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.simulator.schema_values import NO_HINT, Hint, value_for_schema

__all__ = ["FunctionTool", "ToolMode", "arguments_for", "choose_tools", "prompt_hint"]

# "auto", "none", "required", or the name of the one function to call.
ToolMode = str

_WORD = re.compile(r"[A-Za-z][A-Za-z0-9]*")
_STOPWORDS = frozenset(
    "the and for with from that this what when where which your into about have will would should could "
    "there their them they then than been were some more most only also just like over such each other "
    "given using used does make made returns return function tool tools call calls value values".split()
)
_ASKS_FOR_A_TOOL = re.compile(
    r"\b(?:call|invoke|use|run|execute|trigger)\b(?:\s+\w+){0,3}?\s+(?:tool|tools|function|functions)\b"
    r"|\bcall\b|\binvoke\b",
    re.IGNORECASE,
)
_PLACE_NAMES = frozenset(
    {"city", "location", "place", "town", "country", "region", "destination", "address", "where", "area"}
)
# Markup characters never reach generated arguments or JSON: answers are shown as plain text.
_MARKUP = re.compile(r"[<>\[\]()`*_~#|{}\\\"]")
_PLACE = re.compile(r"\b(?:in|at|for|to|near|from)\s+([A-Z][\w'-]*(?:\s+[A-Z][\w'-]*){0,2})")


@dataclass(frozen=True, slots=True)
class FunctionTool:
    name: str
    description: str = ""
    parameters: Mapping[str, Any] = field(default_factory=dict)


def _words(text: str) -> list[str]:
    """Lower-cased words of ``text``, camelCase and snake_case split apart."""
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", text.replace("_", " ").replace("-", " "))
    return [w.lower() for w in _WORD.findall(spaced)]


def _significant(words: Sequence[str]) -> set[str]:
    return {w for w in words if len(w) >= 4 and w not in _STOPWORDS}


def _mention(tool: FunctionTool, text: str, words: set[str]) -> int | None:
    """Where in ``text`` the message asks for ``tool`` (a character offset), or None."""
    spellings = {tool.name, " ".join(_words(tool.name))}
    found = [re.search(rf"(?<![\w-]){re.escape(s)}(?![\w-])", text, re.IGNORECASE) for s in spellings if s]
    positions = [match.start() for match in found if match]
    if positions:
        return min(positions)
    name_hits = _significant(_words(tool.name)) & words
    description = _significant(_words(tool.description))
    description_hits = description & words
    if name_hits or (description and len(description_hits) >= min(2, len(description))):
        hits = name_hits or description_hits
        return min(m.start() for m in _WORD.finditer(text) if m.group().lower() in hits)
    return None


def choose_tools(
    tools: Sequence[FunctionTool], mode: ToolMode, *, parallel: bool, last_user_text: str | None
) -> list[FunctionTool]:
    """The tools the answer calls, in call order (empty: answer with text).

    ``last_user_text`` is None when the conversation ends with tool results: with ``"auto"`` the
    model then answers them instead of calling again.
    """
    if not tools or mode == "none":
        return []
    if mode not in ("auto", "required"):
        return [t for t in tools if t.name == mode][:1]
    text = last_user_text or ""
    words = set(_words(text))
    mentioned = sorted(
        (
            (position, index, tool)
            for index, tool in enumerate(tools)
            if (position := _mention(tool, text, words)) is not None
        ),
        key=lambda found: (found[0], found[1]),
    )
    chosen = [tool for _, _, tool in mentioned]
    if not chosen and mode == "auto" and (last_user_text is None or not _ASKS_FOR_A_TOOL.search(text)):
        return []
    if not chosen:
        chosen = [tools[0]]
    return chosen if parallel else chosen[:1]


def arguments_for(tool: FunctionTool, prompt: str) -> str:
    """The JSON arguments of a call to ``tool``: valid under its parameters schema."""

    parameters = tool.parameters or {"type": "object", "properties": {}}
    value = value_for_schema(parameters, hint=prompt_hint(prompt))
    return json.dumps(value, ensure_ascii=False)


def prompt_hint(prompt: str) -> Hint:
    """A schema hint that takes property values from ``prompt`` where it spells them out."""

    def hint(name: str, schema: Mapping[str, Any]) -> Any:
        return _prompt_value(name, schema, prompt)

    return hint


def _prompt_value(name: str, schema: Mapping[str, Any], prompt: str) -> Any:
    if not prompt:
        return NO_HINT
    enum = schema.get("enum")
    if isinstance(enum, list):
        for option in enum:
            if isinstance(option, str) and re.search(rf"\b{re.escape(option)}\b", prompt, re.IGNORECASE):
                return option
        return NO_HINT
    spelled = r"[\s_-]*".join(re.escape(w) for w in _words(name)) or re.escape(name)
    kind = schema.get("type")
    if kind == "string":
        quoted = re.search(rf"\b{spelled}\b\s*(?:[:=]|is|of|named|called)?\s*[\"']([^\"']{{1,200}})[\"']", prompt, re.I)
        if quoted:
            return _plain(quoted.group(1))
        plain = re.search(rf"\b{spelled}\b\s*(?:[:=]|\bis\b)\s*([\w.@/+-]{{1,100}})", prompt, re.I)
        if plain:
            return _plain(plain.group(1))
        if _PLACE_NAMES & set(_words(name)) or _PLACE_NAMES & set(_words(str(schema.get("description", "")))):
            place = _PLACE.search(prompt)
            if place:
                return place.group(1)
        return NO_HINT
    if kind in ("integer", "number"):
        # "seats: 3", "seats 3" or "3 seats"
        number = re.search(rf"\b{spelled}\b\D{{0,12}}?(-?\d+(?:\.\d+)?)", prompt, re.I) or re.search(
            rf"(-?\d+(?:\.\d+)?)\s+{spelled}\b", prompt, re.I
        )
        if number:
            text = number.group(1)
            if kind == "integer":
                return int(text) if "." not in text else NO_HINT
            return float(text) if "." in text else int(text)
    return NO_HINT


def _plain(value: str) -> Any:
    cleaned = _MARKUP.sub("", value).strip()
    return cleaned or NO_HINT
