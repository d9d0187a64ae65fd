"""Simulated OpenAI-compatible upstreams, reached in-process through the SDK's mock transport
or over loopback HTTP, with latency profiles, fault injection and prefix caching."""

from app.simulator.http_server import SimulatorHTTPServer, make_server, serve
from app.simulator.prefix_cache import PrefixCache
from app.simulator.profiles import LatencyProfile, load_profiles
from app.simulator.server import SimulatedProvider
from app.simulator.transport import make_transport

__all__ = [
    "LatencyProfile",
    "PrefixCache",
    "SimulatedProvider",
    "SimulatorHTTPServer",
    "load_profiles",
    "make_server",
    "make_transport",
    "serve",
]
