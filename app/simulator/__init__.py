"""Simulated OpenAI-compatible upstreams, reached in-process through the SDK's mock transport
or over loopback HTTP: chat completions (tools, structured output, logprobs, n, streaming), the
Responses API with stored conversations, embeddings, legacy completions and models, with latency
profiles, fault injection, prefix caching and OpenAI's rate-limit headers."""

from app.simulator.http_server import SimulatorHTTPServer, make_server, serve
from app.simulator.prefix_cache import PrefixCache
from app.simulator.profiles import LatencyProfile, load_profiles
from app.simulator.responses import ResponseStore
from app.simulator.server import ALL_APIS, SimulatedProvider
from app.simulator.transport import make_transport

__all__ = [
    "ALL_APIS",
    "LatencyProfile",
    "PrefixCache",
    "ResponseStore",
    "SimulatedProvider",
    "SimulatorHTTPServer",
    "load_profiles",
    "make_server",
    "make_transport",
    "serve",
]
