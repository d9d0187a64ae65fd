"""What the playground shows under an answer, and how it explains a failure (with the fix).

Both work on plain data (a :class:`ChatResult` or its ``to_dict()``), so a past answer kept in the
session renders the same as a fresh one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from app.catalog import UnknownModelError, model_names
from app.config import ConfigError, ProviderNotConfigured, Settings
from app.display.fmt import ms, usd
from app.routing import AllRoutesFailed, ChatResult, StreamBrokenError
from core.bounds import parse_int

MAX_TOKENS_LIMIT = 32_768
PROMPT_PREVIEW_CHARS = 2_000  # a longer message is shown cut, with the whole text one click away


@dataclass(frozen=True)
class AnswerMeta:
    headline: str  # provider/model, intent, side, fallback
    timing: str  # ttft and total latency
    tokens: str  # prompt / cached / completion, cost
    attempts: list[dict] = field(default_factory=list)  # one row per attempt, with its error
    request_id: str = ""
    notes: list[str] = field(default_factory=list)


def answer_meta(result: ChatResult | dict) -> AnswerMeta:
    d = result.to_dict() if isinstance(result, ChatResult) else result
    u = d.get("usage") or {}
    side = d.get("side", "?")
    fallback = " · served by the fallback" if d.get("fallback_used") else ""
    headline = f"{d['provider']} / {d['model']} · intent {d.get('intent', '?')} · canary side {side}{fallback}"
    timing = f"TTFT {ms(d.get('ttft_ms'))} · total {ms(d.get('latency_ms'))} · {d.get('attempts', 1)} attempt(s)"
    tokens = (
        f"tokens: {u.get('prompt_tokens', 0)} prompt / {u.get('cached_tokens', 0)} cached / "
        f"{u.get('completion_tokens', 0)} completion · cost {usd(d.get('cost_usd'))}"
    )
    rows = [
        {
            "#": a["number"],
            "provider": a["provider"],
            "model": a["model"],
            "status": a["status"],
            "latency": ms(a.get("latency_ms")),
            "error": a.get("error") or "",
        }
        for a in d.get("attempt_log") or []
    ]
    notes = []
    if d.get("substituted_model"):
        notes.append(
            f"{d['provider']} does not serve the model chosen for this prompt; its default model {d['model']} answered."
        )
    if d.get("finish_reason") == "length":
        notes.append("The answer was cut at max tokens.")
    return AnswerMeta(headline, timing, tokens, rows, d.get("request_id", ""), notes)


# What to do about each error class an attempt can end with.
HINTS = {
    "not_configured": "Set the provider's key environment variable (or put it in .streamlit/secrets.toml) and restart.",
    "auth": "The provider refused the key: check that the key variable holds a valid key.",
    "rate_limited": (
        "The provider is rate limiting: wait a moment, lower the load, or clear the 429 fault injection"
        " on the Canary page."
    ),
    "server_error": "The provider is failing: check its status, or clear the error fault injection on the Canary page.",
    "timeout": (
        "The provider did not answer in time: try again, lower max tokens, or check the latency fault injection."
    ),
    "connection": "Could not reach the provider: check its base_url and the network.",
    "not_found": "The provider does not serve this model: choose another model or auto.",
    "bad_request": "The provider rejected the request: check temperature, max tokens and the prompt.",
    "bad_response": "The provider sent a malformed answer: try again or check the provider.",
    "stream_broken": "The stream broke mid-answer: send the prompt again.",
}


@dataclass(frozen=True)
class FailureView:
    title: str
    lines: list[str]
    fix: str


def _env_hint(settings: Settings | None, provider: str) -> str | None:
    if settings is None or provider not in settings.providers:
        return None
    var = settings.providers[provider].api_key_env
    return f"set {var}" if var else None


def explain_failure(exc: BaseException, settings: Settings | None = None) -> FailureView:
    """A message for the operator with the fix; never a traceback."""
    if isinstance(exc, AllRoutesFailed):
        lines = [f"attempt {a.number}: {a.provider} / {a.model}: {a.error or a.status}" for a in exc.attempts]
        fixes = []
        for a in exc.attempts:
            hint = HINTS.get(a.error_class or "", "")
            if a.error_class == "not_configured":
                env = _env_hint(settings, a.provider)
                hint = f"{a.provider}: {env} (environment or .streamlit/secrets.toml) and restart." if env else hint
            if hint and hint not in fixes:
                fixes.append(hint)
        return FailureView(
            f"All routes failed (request {exc.request_id})",
            lines,
            " ".join(fixes) or "Check the providers on the Overview page.",
        )
    if isinstance(exc, ProviderNotConfigured):
        return FailureView(
            f"Provider {exc.provider} is not configured",
            [str(exc)],
            f"Set {exc.env_var} in the environment or .streamlit/secrets.toml and restart.",
        )
    if isinstance(exc, UnknownModelError):
        return FailureView(f"Unknown model {exc.model!r}", [], f"Choose auto or one of: {', '.join(model_names())}.")
    if isinstance(exc, StreamBrokenError):
        return FailureView("The answer stream broke", [str(exc)], HINTS["stream_broken"])
    if isinstance(exc, ConfigError):
        return FailureView("Configuration error", [str(exc)], "Fix the file named above (GATEWAY_CONFIG) and reload.")
    if isinstance(exc, ValueError):
        return FailureView("The request was refused", [str(exc)], "Correct the value and send again.")
    return FailureView(
        f"Unexpected error: {type(exc).__name__}", [str(exc)[:500]], "Try again; if it persists, check the server log."
    )


def parse_max_tokens(raw: object) -> int:
    """The playground's Max tokens as typed; ``ValueError`` (one line, for the operator) when it is
    not a whole number from 1 to :data:`MAX_TOKENS_LIMIT`: nothing is sent then."""
    return parse_int(raw, field="Max tokens", lo=1, hi=MAX_TOKENS_LIMIT)  # type: ignore[arg-type]


def preview(text: str, limit: int = PROMPT_PREVIEW_CHARS) -> tuple[str, int]:
    """``text`` cut to ``limit`` characters for display, and how many characters were left out."""
    if len(text) <= limit:
        return text, 0
    return text[:limit], len(text) - limit


def build_messages(system_prompt: str, history: list[dict], prompt: str) -> list[dict]:
    """The conversation sent upstream: optional system prompt, previous turns, the new prompt."""
    msgs: list[dict] = []
    if system_prompt.strip():
        msgs.append({"role": "system", "content": system_prompt.strip()})
    msgs += [{"role": m["role"], "content": m["content"]} for m in history if m.get("content")]
    msgs.append({"role": "user", "content": prompt})
    return msgs
