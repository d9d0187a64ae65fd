"""The OpenAI-compatible gateway server's building blocks: Prometheus metrics (``metrics``), the
OpenAI wire format (``wire``) and the ASGI application (``asgi``). Keys, limits and budgets live in
``db.keys`` and ``db.limits``."""
