"""The fast upstream and the "bare floor" hop of ``python -m benchmarks proxy``: Debian's nginx.

Two nginx servers in one master process, both bound to 127.0.0.1:

* the **upstream**: ``POST .../chat/completions`` answers a fixed completion, or (when the body asks
  to stream) a 200-chunk SSE stream, from ``content_by_lua_block`` (``libnginx-mod-http-lua``:
  plain ``return`` cannot look at the body, and njs reached only ~700 req/s here against 10k+);
  ``GET .../models`` answers a model list. No think time: at 10k+ req/s it is never what a proxy
  under test waits for.
* the **floor**: ``proxy_pass`` to the upstream with keep-alive connections, a hop that does
  nothing, so "added latency" has a lower bound measured the same way.

``nginx`` runs as the current user with its prefix, pid, logs and temp paths in a directory of the
benchmark's own; ``stop()`` sends it SIGQUIT (graceful) and waits.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

NGINX = shutil.which("nginx") or "/usr/sbin/nginx"
LUA_MODULES = ("/usr/lib/nginx/modules/ndk_http_module.so", "/usr/lib/nginx/modules/ngx_http_lua_module.so")


def available() -> str | None:
    """None when nginx with the Lua module is installed; else why not (and the Fix)."""
    if not Path(NGINX).exists():
        return "nginx is not installed. Fix: apt-get install nginx libnginx-mod-http-lua"
    missing = [m for m in LUA_MODULES if not Path(m).exists()]
    if missing:
        return f"{missing[0]} is missing. Fix: apt-get install libnginx-mod-http-lua"
    return None


def completion_body(model: str) -> str:
    return json.dumps(
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "created": 1700000000,
            "model": model,
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": "Hello there!"}, "finish_reason": "stop"}
            ],
            "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15},
        },
        separators=(",", ":"),
    )


def stream_body(model: str, chunks: int) -> str:
    def chunk(delta: dict, finish: str | None, usage: dict | None = None, choices: bool = True) -> str:
        obj: dict = {
            "id": "chatcmpl-bench",
            "object": "chat.completion.chunk",
            "created": 1700000000,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}] if choices else [],
        }
        if usage is not None:
            obj["usage"] = usage
        return "data: " + json.dumps(obj, separators=(",", ":")) + "\n\n"

    parts = [chunk({"role": "assistant", "content": ""}, None)]
    parts += [chunk({"content": f"w{i} "}, None) for i in range(chunks)]
    parts.append(chunk({}, "stop"))
    usage = {"prompt_tokens": 12, "completion_tokens": chunks, "total_tokens": 12 + chunks}
    parts.append(chunk({}, None, usage, False))
    parts.append("data: [DONE]\n\n")
    return "".join(parts)


def config(work: Path, upstream_port: int, floor_port: int, model: str, chunks: int) -> str:
    models = json.dumps({"object": "list", "data": [{"id": model, "object": "model", "owned_by": "bench"}]})
    # The payloads are files read once at start: an inline Lua string this long is refused.
    (work / "completion.json").write_text(completion_body(model))
    (work / "stream.sse").write_text(stream_body(model, chunks))
    (work / "models.json").write_text(models)
    temp = work / "tmp"
    modules = "".join(f"load_module {m};\n" for m in LUA_MODULES)
    return f"""{modules}
worker_processes 1;
daemon off;
master_process on;
pid {work}/nginx.pid;
error_log {work}/error.log warn;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    client_body_temp_path {temp}/body;
    proxy_temp_path {temp}/proxy;
    fastcgi_temp_path {temp}/fastcgi;
    uwsgi_temp_path {temp}/uwsgi;
    scgi_temp_path {temp}/scgi;
    keepalive_requests 1000000;
    keepalive_timeout 120s;
    client_body_buffer_size 64k;
    tcp_nodelay on;
    init_by_lua_block {{
        local function slurp(path)
            local f = assert(io.open(path, "rb"))
            local data = f:read("*a")
            f:close()
            return data
        end
        COMPLETION = slurp("{work}/completion.json")
        STREAM = slurp("{work}/stream.sse")
        MODELS = slurp("{work}/models.json")
    }}
    server {{
        listen 127.0.0.1:{upstream_port} backlog=4096;
        location ~ /models$ {{
            default_type application/json;
            content_by_lua_block {{ ngx.print(MODELS) }}
        }}
        location / {{
            content_by_lua_block {{
                ngx.req.read_body()
                local body = ngx.req.get_body_data() or ""
                if string.find(body, '"stream"%s*:%s*true') then
                    ngx.header["Content-Type"] = "text/event-stream"
                    ngx.print(STREAM)
                else
                    ngx.header["Content-Type"] = "application/json"
                    ngx.print(COMPLETION)
                end
            }}
        }}
    }}
    upstream bench_upstream {{
        server 127.0.0.1:{upstream_port};
        keepalive 512;
    }}
    server {{
        listen 127.0.0.1:{floor_port} backlog=4096;
        location / {{
            proxy_pass http://bench_upstream;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
        }}
    }}
}}
"""


@dataclass
class Nginx:
    proc: subprocess.Popen
    upstream_port: int
    floor_port: int

    @property
    def upstream(self) -> str:
        return f"http://127.0.0.1:{self.upstream_port}"

    @property
    def floor(self) -> str:
        return f"http://127.0.0.1:{self.floor_port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start(
    work: Path, upstream_port: int, floor_port: int, *, model: str, chunks: int, config_text: str | None = None
) -> Nginx:
    """nginx on the two ports with :func:`config`, or with ``config_text`` (a variant of it)."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "tmp").mkdir(exist_ok=True)
    conf = work / "nginx.conf"
    conf.write_text(config_text if config_text is not None else config(work, upstream_port, floor_port, model, chunks))
    proc = subprocess.Popen(
        [NGINX, "-p", str(work), "-c", str(conf), "-e", str(work / "error.log")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 20
    import socket

    while True:
        if proc.poll() is not None:
            err = proc.stderr.read().decode(errors="replace")[-800:] if proc.stderr else ""
            raise RuntimeError(f"nginx exited ({proc.returncode}): {err}")
        try:
            for port in (upstream_port, floor_port):
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return Nginx(proc, upstream_port, floor_port)
        except OSError:
            if time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("nginx did not listen within 20 s") from None
            time.sleep(0.05)  # waiting for nginx to listen, bounded
