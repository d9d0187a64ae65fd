"""Gateway configurations the tests share: real (non-simulated) providers in different places."""

from __future__ import annotations


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
