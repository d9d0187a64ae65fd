"""Pure parts of the simulator: tokenizer, prefix cache, latency profiles, fault settings."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from app.simulator import PrefixCache, load_profiles
from app.simulator.answers import compose_answer
from app.simulator.profiles import profile_for
from app.simulator.tokens import prompt_tokens, tokenize, truncate_to_tokens
from core.faults import FaultSettings


def test_tokenize_splits_words_punctuation_and_long_words() -> None:
    assert tokenize("Hello, world!") == ["Hell", "o", ",", "worl", "d", "!"]
    assert tokenize("a bb ccc dddd") == ["a", "bb", "ccc", "dddd"]
    assert tokenize("   ") == []


@given(st.text(max_size=200), st.integers(min_value=0, max_value=120))
def test_truncation_keeps_the_token_count_exact(text: str, limit: int) -> None:
    cut = truncate_to_tokens(text, limit)
    assert text.startswith(cut)
    assert tokenize(cut) == tokenize(text)[: min(limit, len(tokenize(text)))]


def test_a_grown_conversation_starts_with_the_tokens_of_the_shorter_one() -> None:
    short = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is KV cache?"}]
    grown = [*short, {"role": "assistant", "content": "A cache."}, {"role": "user", "content": "More?"}]
    assert prompt_tokens(grown)[: len(prompt_tokens(short))] == prompt_tokens(short)
    assert prompt_tokens([{"role": "user", "content": [{"type": "text", "text": "hi"}]}]) == [
        "<|user|>",
        "hi",
        "<|end|>",
    ]


def test_prefix_cache_counts_leading_known_blocks_only() -> None:
    cache = PrefixCache(block_tokens=4, max_blocks=100)
    first = [f"t{i}" for i in range(10)]  # 2 full blocks + 2 loose tokens
    assert cache.lookup_and_insert(first) == 0
    assert len(cache) == 2
    assert cache.lookup_and_insert([*first, "x", "y", "z"]) == 8  # third block is new
    assert cache.lookup_and_insert([*first, "x", "y", "z"]) == 12
    # Same second block after a different first block: the chain hash makes it a miss.
    assert cache.lookup_and_insert(["other", "t1", "t2", "t3", *first[4:8]]) == 0


def test_prefix_cache_lru_evicts_the_oldest_blocks() -> None:
    cache = PrefixCache(block_tokens=2, max_blocks=3)
    a, b = ["a1", "a2", "a3", "a4"], ["b1", "b2", "b3", "b4"]
    cache.lookup_and_insert(a)
    cache.lookup_and_insert(b)  # 4 blocks > 3: a's first block goes
    assert len(cache) == 3
    assert cache.lookup_and_insert(b) == 4
    assert cache.lookup_and_insert(a) == 0  # chain broken at the evicted first block


def test_prefix_cache_is_thread_safe() -> None:
    cache = PrefixCache(block_tokens=2, max_blocks=500)
    barrier = threading.Barrier(8)

    def work(n: int) -> None:
        barrier.wait()
        for i in range(200):
            cache.lookup_and_insert([f"{n}", f"{i}", "x", "y"])

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(cache) == 500


def test_profiles_load_with_default_and_known_models() -> None:
    profiles = load_profiles()
    for model in ("default", "deepseek-chat-v3.2", "claude-sonnet-4-20250514", "gemini-2.5-flash", "gpt-4.1"):
        assert 100 <= profiles[model].ttft_ms <= 400
        assert 60 <= profiles[model].tokens_per_s <= 250
    assert profile_for(profiles, "unknown-model") == profiles["default"]
    profiles.clear()
    assert "default" in load_profiles()  # callers cannot damage the cached copy


def test_profiles_file_errors_are_clear(tmp_path: Path) -> None:
    bad = tmp_path / "p.toml"
    bad.write_text('[models."x"]\nttft_ms = 1\ntokens_per_s = 0\njitter = 0.1\n')
    with pytest.raises(ValueError, match="invalid simulator latency profiles"):
        load_profiles(bad)
    no_default = tmp_path / "q.toml"
    no_default.write_text('[models."x"]\nttft_ms = 1\ntokens_per_s = 5\njitter = 0.1\n')
    with pytest.raises(ValueError, match="default"):
        load_profiles(no_default)


@pytest.mark.parametrize(
    "bad",
    [{"error_rate": 1.5}, {"rate_limit_rate": -0.1}, {"latency_multiplier": 0}, {"retry_after_s": -1}, {"typo": 1}],
)
def test_fault_settings_reject_out_of_range_values(bad: dict) -> None:
    with pytest.raises(ValidationError):
        FaultSettings(**bad)


def test_fault_settings_are_frozen() -> None:
    with pytest.raises(ValidationError):
        FaultSettings().error_rate = 0.5  # type: ignore[misc]


@given(st.text(max_size=300))
def test_answers_are_plain_text_and_labelled(user_text: str) -> None:
    messages = [{"role": "user", "content": user_text}]
    answer = compose_answer("p", "m", messages, prompt_tokens(messages), None)
    assert answer.text.startswith("[simulated p/m] This is a simulated answer")
    assert not set("<>&`()[]") & set(answer.text.removeprefix("[simulated p/m]"))
    assert answer == compose_answer("p", "m", messages, prompt_tokens(messages), None)
