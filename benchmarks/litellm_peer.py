"""LiteLLM's in-process router as a side-by-side peer, run in its own virtualenv.

``litellm[proxy]==1.108.7`` does not go into the project's environment (newer versions need a
package the index does not serve, and it pins its own dependency set), so it lives in
``benchmarks/_work/litellm-venv`` and this file is two things:

* run by *that* interpreter (``python litellm_peer.py URL MODEL``), a worker that builds a
  ``litellm.Router`` for one model on the given OpenAI-compatible base URL (retries off) and, for
  each line ``N`` on stdin, makes N timed ``router.completion`` calls and answers one JSON list of
  milliseconds on stdout; it imports nothing of this project;
* imported by the router benchmark, :class:`LiteLLMPeer`, which installs the venv on first use
  (``ensure_venv``) and drives the worker block by block, so its blocks interleave with ours.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

VERSION = "1.108.7"
VENV = Path(__file__).resolve().parent / "_work" / "litellm-venv"
PYTHON = VENV / "bin" / "python"


def ensure_venv(install: bool = True) -> str | None:
    """``None`` when the venv has LiteLLM, else why not (after trying to install it once)."""
    if _installed():
        return None
    if not install:
        return f"litellm {VERSION} is not installed in {VENV}"
    if not PYTHON.exists():
        made = subprocess.run(["python3", "-m", "venv", str(VENV)], capture_output=True, text=True)
        if made.returncode != 0:
            return f"could not create {VENV}: {_last_line(made.stderr)}"
    pip = subprocess.run(
        [str(PYTHON), "-m", "pip", "install", "-q", f"litellm[proxy]=={VERSION}"], capture_output=True, text=True
    )
    if pip.returncode != 0 or not _installed():
        return f"could not install litellm[proxy]=={VERSION} into {VENV}: {_last_line(pip.stderr)}"
    return None


def _installed() -> bool:
    if not PYTHON.exists():
        return False
    out = subprocess.run(
        [str(PYTHON), "-c", "import importlib.metadata as m; print(m.version('litellm'))"],
        capture_output=True,
        text=True,
    )
    return out.returncode == 0 and out.stdout.strip() == VERSION


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if not ln.startswith("WARNING")]
    return lines[-1] if lines else "(no output)"


class LiteLLMPeer:
    """A worker process running ``litellm.Router.completion`` against ``base_url`` for ``model``."""

    def __init__(self, base_url: str, model: str, messages: list[dict]):
        env = {
            **os.environ,
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no price-map download
            "LITELLM_LOG": "ERROR",
        }
        self.proc = subprocess.Popen(
            [str(PYTHON), __file__, base_url, model, json.dumps(messages)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.block(1)  # import and first call outside the measurement

    def block(self, n: int) -> list[float]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{n}\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"litellm worker exited: {self.proc.stderr.read().strip()[-500:]}")
        return json.loads(line)

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _worker(base_url: str, model: str, messages: list[dict]) -> None:
    import litellm  # only in the litellm venv

    router = litellm.Router(
        model_list=[
            {
                "model_name": model,
                "litellm_params": {"model": f"openai/{model}", "api_base": base_url, "api_key": "bench-key"},
            }
        ],
        num_retries=0,
    )
    for line in sys.stdin:
        n = int(line)
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            router.completion(model=model, messages=messages)
            times.append((time.perf_counter() - t0) * 1000.0)
        sys.stdout.write(json.dumps(times) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    _worker(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]))
