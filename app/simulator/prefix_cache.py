"""Simulated prefix (KV) caching: which prompt blocks an upstream has seen recently.

Serving engines cache attention state per fixed-size block of prompt tokens, keyed by a hash
that chains over every earlier block, so a block only hits when the whole prefix before it is
identical. This module keeps those chain hashes in a bounded LRU, one cache per provider.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Sequence

__all__ = ["PrefixCache"]

# Tokens never contain NUL, so joining with it cannot make two different blocks collide.
_SEPARATOR = "\x00"


class PrefixCache:
    """Thread-safe bounded LRU of block chain hashes."""

    def __init__(self, block_tokens: int = 16, max_blocks: int = 50_000) -> None:
        if block_tokens < 1:
            raise ValueError("block_tokens must be >= 1")
        if max_blocks < 1:
            raise ValueError("max_blocks must be >= 1")
        self.block_tokens = block_tokens
        self.max_blocks = max_blocks
        self._blocks: OrderedDict[bytes, None] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._blocks)

    def clear(self) -> None:
        with self._lock:
            self._blocks.clear()

    def _chain_hashes(self, tokens: Sequence[str]) -> list[bytes]:
        hashes: list[bytes] = []
        previous = b""
        full_blocks = len(tokens) // self.block_tokens
        for index in range(full_blocks):
            block = tokens[index * self.block_tokens : (index + 1) * self.block_tokens]
            previous = hashlib.sha256(previous + _SEPARATOR.join(block).encode("utf-8")).digest()
            hashes.append(previous)
        return hashes

    def lookup_and_insert(self, tokens: Sequence[str]) -> int:
        """Cached token count of ``tokens`` (leading known blocks), then remember all full blocks."""
        hashes = self._chain_hashes(tokens)
        with self._lock:
            hits = 0
            for block_hash in hashes:
                if block_hash not in self._blocks:
                    break
                hits += 1
            for block_hash in hashes:
                self._blocks[block_hash] = None
                self._blocks.move_to_end(block_hash)
            while len(self._blocks) > self.max_blocks:
                self._blocks.popitem(last=False)
        return hits * self.block_tokens
