"""Extracts the component schemas the client tests validate against from the official OpenAI OpenAPI
document (repository ``openai/openai-openapi``, file ``openapi.yaml``) into ``schemas.json`` beside
this script, recording the source repository, file and commit.

    python tests/support/openai_openapi/extract.py --git-dir PATH/TO/openai-openapi.git [--rev HEAD]
    python tests/support/openai_openapi/extract.py --file openapi.yaml --commit SHA

Only the named roots and every schema they reach through ``$ref`` are kept, and annotation-only
keywords (descriptions, examples, ``x-oaiMeta``) are dropped: they never change what validates, and
they are most of the document's size. Rerun it to move to a newer spec; the tests then tell what changed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = "openai/openai-openapi"
SPEC_FILE = "openapi.yaml"
OUT = Path(__file__).with_name("schemas.json")

# What the gateway returns, per endpoint (chat, its stream, legacy completions, embeddings, Responses
# API objects and stream events, models, errors).
ROOTS = [
    "CreateChatCompletionResponse",
    "CreateChatCompletionStreamResponse",
    "CreateCompletionResponse",
    "CreateEmbeddingResponse",
    "Response",
    "ResponseStreamEvent",
    "Model",
    "ListModelsResponse",
    "ErrorResponse",
]
ANNOTATIONS = {"description", "example", "examples", "x-oaiMeta"}
REF_PREFIX = "#/components/schemas/"


def _strip(node: Any) -> Any:
    if isinstance(node, dict):
        # A property *named* "description" or "example" is kept: only keywords at schema level go.
        props = node.get("properties")
        out = {k: _strip(v) for k, v in node.items() if k not in ANNOTATIONS or k == "properties"}
        if isinstance(props, dict):
            out["properties"] = {k: _strip(v) for k, v in props.items()}
        return out
    if isinstance(node, list):
        return [_strip(v) for v in node]
    return node


def _refs(node: Any):
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "$ref" and isinstance(v, str):
                yield v
            else:
                yield from _refs(v)
    elif isinstance(node, list):
        for v in node:
            yield from _refs(v)


def closure(schemas: dict[str, Any], roots: list[str]) -> dict[str, Any]:
    """``roots`` and every component schema they reach, annotations stripped."""
    seen: dict[str, Any] = {}
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        if name not in schemas:
            raise SystemExit(f"schema {name!r} is not in the document")
        seen[name] = _strip(schemas[name])
        for ref in _refs(schemas[name]):
            if not ref.startswith(REF_PREFIX):
                raise SystemExit(f"{name}: unsupported $ref {ref!r} (only {REF_PREFIX}...)")
            todo.append(ref.removeprefix(REF_PREFIX))
    return dict(sorted(seen.items()))


def _load(text: str, filename: str) -> dict[str, Any]:
    if filename.endswith(".json"):
        return json.loads(text)
    import yaml  # PyYAML: in the dev lock (a dependency of langchain-core)

    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--git-dir", help="a clone (bare is fine) of openai/openai-openapi")
    ap.add_argument("--rev", default="HEAD")
    ap.add_argument("--file", help=f"a local copy of the spec instead of --git-dir (default name {SPEC_FILE})")
    ap.add_argument("--commit", help="with --file: the commit it was taken from")
    args = ap.parse_args(argv)
    if args.git_dir:
        git = ["git", f"--git-dir={args.git_dir}"]
        commit = subprocess.run(
            [*git, "rev-parse", args.rev], check=True, capture_output=True, text=True
        ).stdout.strip()
        text = subprocess.run(
            [*git, "show", f"{commit}:{SPEC_FILE}"], check=True, capture_output=True, text=True
        ).stdout
        filename = SPEC_FILE
    elif args.file and args.commit:
        commit, filename = args.commit, Path(args.file).name
        text = Path(args.file).read_text()
    else:
        ap.error("give --git-dir, or --file with --commit")
    doc = _load(text, filename)
    schemas = closure(doc["components"]["schemas"], ROOTS)
    out = {
        "source": {"repo": REPO, "file": filename, "commit": commit, "openapi": doc.get("openapi")},
        "roots": ROOTS,
        "schemas": schemas,
    }
    OUT.write_text(json.dumps(out, indent=1, sort_keys=False, ensure_ascii=False) + "\n")
    print(f"{OUT}: {len(schemas)} schemas from {REPO}@{commit} ({filename})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
