"""Test-only helpers shared across the suite (servers and fakes that are not part of the product)."""
