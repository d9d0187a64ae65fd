"""``make run``'s launcher: a taken or invalid port is one clear error before anything starts; the
two children are the dashboard and the gateway server, both on 127.0.0.1."""

from __future__ import annotations

import socket

from app import launch


def test_a_taken_port_is_refused_before_starting_anything(capsys, monkeypatch):
    started = []
    monkeypatch.setattr(launch.subprocess, "Popen", lambda *a, **k: started.append(a))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        taken = s.getsockname()[1]
        assert launch.port_problem(taken) == f"127.0.0.1:{taken} is already in use"
        assert launch.main(["--gateway-port", str(taken), "--dashboard-port", "0"]) == 2
    err = capsys.readouterr().err
    assert f"gateway port: 127.0.0.1:{taken} is already in use" in err and "GATEWAY_PORT=" in err
    assert "dashboard port: port 0 is not between 1 and 65535" in err
    assert started == []


def test_same_port_twice_is_refused(capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    assert launch.main(["--gateway-port", str(free), "--dashboard-port", str(free)]) == 2
    assert "two different ports" in capsys.readouterr().err


def test_children_bind_to_loopback_on_the_given_ports():
    server, dashboard = launch.children(8601, 8001, python="py")
    assert server.argv == ["py", "-m", "app", "serve", "--host", "127.0.0.1", "--port", "8001"]
    assert server.url == "http://127.0.0.1:8001/v1"
    assert dashboard.argv[:4] == ["py", "-m", "app", "dashboard"]
    assert "--server.address" in dashboard.argv and "127.0.0.1" in dashboard.argv
    assert dashboard.argv[dashboard.argv.index("--server.port") + 1] == "8601"
