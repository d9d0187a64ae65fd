"""Gateway configurations the tests share: real (non-simulated) providers in different places."""

from __future__ import annotations

from pathlib import Path

_REPO = Path(__file__).resolve().parent.parent


def two_providers(primary: str = "sim", fallback: str = "sim", models: str = '["gpt-4.1"]') -> str:
    """TOML with provider ``holysheep`` (primary) and ``direct`` (fallback), each either ``sim``
    (the built-in simulator) or ``real`` (an https URL whose key comes from the environment)."""

    def provider(name: str, kind: str, url: str, key_env: str) -> str:
        base = f'base_url = "sim://{name}"' if kind == "sim" else f'base_url = "{url}"\napi_key_env = "{key_env}"'
        return f'[providers.{name}]\n{base}\nmodels = {models}\ndefault_model = "gpt-4.1"\n'

    return (
        '[routing]\nprimary = "holysheep"\nfallback = "direct"\n'
        + provider("holysheep", primary, "https://api.holysheep.example/v1", "HOLYSHEEP_API_KEY")
        + provider("direct", fallback, "https://api.openai.example/v1", "OPENAI_API_KEY")
    )


def one_sided_toml(base: str | None = None) -> str:
    """``base`` (default: the shipped gateway.toml) with an ``[intents]`` table of its own whose
    coding and math rules pick deepseek-chat-v3.2 and whose long-context model is claude: models
    only the primary serves. A configuration that routes to one side says so itself, like this."""
    text = base if base is not None else (_REPO / "gateway.toml").read_text()
    rules = (_REPO / "tests" / "fixtures" / "intent_rules_one_sided.toml").read_text()
    head, _, rest = rules.partition("[[rules]]")
    top = "\n".join(line for line in head.splitlines() if line and not line.startswith("#"))
    return text + "\n[intents]\n" + top + "\n\n[[intents.rules]]" + rest.replace("[[rules]]", "[[intents.rules]]")
