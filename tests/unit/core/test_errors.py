"""One error hierarchy: every error the gateway raises on purpose is a GatewayError, and keeps the
ValueError / RuntimeError base its callers relied on before."""

from __future__ import annotations

import pytest

from app.__main__ import CliError, exit_code
from app.catalog import UnknownModelError
from app.config import ConfigError, ProviderNotConfigured
from app.routing import AllRoutesFailed, GatewayError, StreamBrokenError
from core.errors import ConfigurationError, ConflictError, InvalidRequest, UpstreamError
from db.canary import CanaryState, StaleCanaryError, validate_ratio


@pytest.mark.parametrize(
    ("exc", "kind", "legacy"),
    [
        (ConfigError("bad"), ConfigurationError, ValueError),
        (ProviderNotConfigured("p", "P_KEY"), ConfigurationError, RuntimeError),
        (UnknownModelError("nope"), InvalidRequest, ValueError),
        (AllRoutesFailed("r1", []), UpstreamError, RuntimeError),
        (StreamBrokenError("cut"), UpstreamError, RuntimeError),
        (StaleCanaryError(CanaryState(0.5, 3, 0.0, "bob", "why")), ConflictError, RuntimeError),
    ],
)
def test_every_error_is_a_gateway_error_of_its_kind(exc, kind, legacy):
    assert isinstance(exc, GatewayError) and isinstance(exc, kind) and isinstance(exc, legacy)


def test_refused_input_is_an_invalid_request_and_still_a_value_error():
    with pytest.raises(InvalidRequest, match="between 0 and 1"):
        validate_ratio(1.5)
    with pytest.raises(ValueError):
        validate_ratio("x")


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (UnknownModelError("nope"), 2),
        (ConfigError("bad"), 2),
        (StaleCanaryError(CanaryState(0.5, 3, 0.0, "bob", "why")), 2),
        (CliError("x", code=3), 3),
        (AllRoutesFailed("r1", []), 1),
        (ProviderNotConfigured("p", "P_KEY"), 1),
    ],
)
def test_cli_exit_codes_by_kind(exc, code):
    assert exit_code(exc) == code


def test_log_level_comes_from_the_environment_and_a_bad_one_is_refused():
    import logging

    from app.__main__ import configure_logging

    with pytest.raises(CliError, match="LOG_LEVEL='LOUD' is not a logging level"):
        configure_logging({"LOG_LEVEL": "loud"})
    configure_logging({"LOG_LEVEL": "info"})  # accepted, any case (basicConfig keeps pytest's handlers)
    assert logging.getLevelName("INFO") == logging.INFO
