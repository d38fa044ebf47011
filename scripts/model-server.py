#!/usr/bin/env python3
"""Serve a GGUF model on an OpenAI-compatible endpoint, for the tests and
`./dev run --tiny-model` (docs/agents.md § The model agent).

Runs llama.cpp's server from PyPI's `xllamacpp` (put it on PYTHONPATH) on
127.0.0.1:PORT with the chat template TEMPLATE — one that renders the
request's tools and `<tool_call>` tags, with one example exchange per tool,
which is what makes a model as small as SmolLM2-135M call them — on one
thread (faster than two on a two-core machine), with a repeat penalty. Prints `listening URL`
once it answers, then serves until SIGTERM or SIGINT.

usage: model-server.py MODEL.gguf PORT TEMPLATE.jinja
"""

import signal
import sys
import threading


def main() -> int:
    if len(sys.argv) != 4:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    model, port, template = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    try:
        import xllamacpp
    except ImportError:
        print("xllamacpp is not on PYTHONPATH (./dev installs it)", file=sys.stderr)
        return 2
    params = xllamacpp.CommonParams()
    params.model.path = model
    params.port = port
    params.hostnames = ["127.0.0.1"]
    params.n_ctx = 4096
    params.n_parallel = 1
    params.cpuparams.n_threads = 1
    params.cpuparams_batch.n_threads = 1
    params.use_jinja = True
    with open(template, encoding="utf-8") as f:
        params.chat_template = f.read()
    params.warmup = False
    # A model this small repeats itself until the token limit cuts its
    # tool call's arguments short; a repeat penalty keeps them whole.
    params.sampling.penalty_repeat = 1.1
    server = xllamacpp.Server(params)
    print(f"listening {server.listening_address}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
