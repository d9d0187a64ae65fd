"""Everything of the routing that sends, waits or reads a clock: the two drivers (the sync
:class:`~app.routing.io.client.RoutingClient` and the server's async one), the HTTP client for real
upstreams, the attempt deadlines, the response-size limit, the connection slots, and the mapping of
the HTTP client's exceptions to the core's failure classes. The decisions are the core's
(:mod:`app.routing.core` and its modules), which import nothing of this package."""
