"""Domain types shared by ``app`` and ``db``: the attempt record, the latency histogram layout, the
simulated upstreams' fault settings and the gateway's error hierarchy.

Imports nothing of ours (only the standard library and pydantic), so every other package can depend
on it and the arrows of the import graph point one way: pages -> ui -> app -> db -> core.
"""
