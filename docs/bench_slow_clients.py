"""How many slow clients one `make serve` survives: good requests answered while K connections trickle.

For a bake installed in this Python, the script starts ``python -m <package>.commands.serve`` on a
loopback port with the server's file-descriptor limit set to ``--nofile`` (``ulimit -n``, 1024 by
default, a common default), then for each K opens K connections from another loopback address
(127.0.0.2, one client) that send, with ``--slow bodies``, their headers and the start of a body and
nothing more, or with ``--slow headers``, a request line and then a header line a second (the client's
own limit is raised to the hard limit). While they are held, it sends ``--good`` good requests from
127.0.0.1 one after another (a fresh connection each, 10 s timeout) and counts those answered 200;
then it waits up to ``--wait`` seconds for every slow connection's answer and sends the good requests
again (recovery). Each slow connection's answer is counted: 408 at its deadline, 503 (refused over
the bound of connections per client), a reset, or none. ``--server`` passes an option to the server
(``--server=--max_client_connections=0`` for no bound).

    python docs/bench_slow_clients.py digits_classifier /path/to/best.ckpt --counts 250 900 2000 --slow headers

Prints one Markdown table row per K.
"""

import argparse
import collections
import contextlib
import functools
import json
import os
import resource
import selectors
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

HEAD = b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
FIRST = {"bodies": HEAD + b'{"inputs": [', "headers": b"POST /predict HTTP/1.1\r\n"}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def post(port: int, body: bytes) -> tuple[int, float]:
    start = time.perf_counter()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/predict", data=body, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            answer.read()
            return answer.status, time.perf_counter() - start
    except urllib.error.HTTPError as error:
        return error.code, time.perf_counter() - start
    except OSError:  # reset, refused, timed out
        return 0, time.perf_counter() - start


def good_round(port: int, body: bytes, count: int) -> tuple[int, float]:
    results = [post(port, body) for _ in range(count)]
    answered = [seconds for status, seconds in results if status == 200]
    return len(answered), (sorted(answered)[len(answered) // 2] if answered else float("nan"))


def answers_of(connections: list[socket.socket], trickle: bool, seconds: float) -> list[bytes]:
    """Each connection's first bytes (b"" for a reset, b"none" for no answer in ``seconds``), sending
    a header line a second on each one not yet answered when ``trickle``."""
    answers: dict[socket.socket, bytes] = {}
    deadline = time.monotonic() + seconds
    with selectors.DefaultSelector() as readable:  # epoll: select() takes no descriptor past 1023
        for connection in connections:
            readable.register(connection, selectors.EVENT_READ)
        while len(answers) < len(connections) and time.monotonic() < deadline:
            for key, _ in readable.select(1.0):
                readable.unregister(key.fileobj)
                answers[key.fileobj] = b""
                with contextlib.suppress(OSError):
                    answers[key.fileobj] = key.fileobj.recv(64)
            for connection in connections if trickle else ():
                if connection not in answers:
                    with contextlib.suppress(OSError):
                        connection.sendall(b"X-Slow: 1\r\n")
    for connection in connections:
        connection.close()
    return [answers.get(connection, b"none") for connection in connections]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("package")
    parser.add_argument("ckpt")
    parser.add_argument("--counts", type=int, nargs="+", default=[250, 500, 900, 2000])
    parser.add_argument("--nofile", type=int, default=1024)
    parser.add_argument("--body_timeout", type=float, default=10.0)
    parser.add_argument("--good", type=int, default=20)
    parser.add_argument("--wait", type=float, default=60.0, help="seconds to wait for the slow ones' answers")
    parser.add_argument("--slow", choices=sorted(FIRST), default="bodies")
    parser.add_argument("--server", action="append", default=[], help="an option for the server (repeatable)")
    args = parser.parse_args()
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    body = json.dumps({"inputs": [[[[0.0] * 8] * 8]]}).encode()  # one digits example (1, 8, 8) as JSON
    print(
        f"| slow {args.slow} from one client (server ulimit -n {args.nofile}, {' '.join(args.server) or 'defaults'}) "
        "| good answered while held | p50 | slow ones answered 408 | refused (503 or reset) "
        f"| no answer in {args.wait:g} s | good answered after |"
    )
    print("|---|---|---|---|---|---|---|")
    for count in args.counts:
        port = free_port()
        command = [sys.executable, "-m", f"{args.package}.commands.serve", "--ckpt", args.ckpt, "--port", str(port)]
        command += ["--body_timeout", str(args.body_timeout), *args.server]
        server = subprocess.Popen(
            command,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=functools.partial(resource.setrlimit, resource.RLIMIT_NOFILE, (args.nofile, args.nofile)),
        )
        try:
            deadline = time.monotonic() + 120
            while post(port, body)[0] != 200:
                if time.monotonic() > deadline or server.poll() is not None:
                    sys.exit("the server did not start")
                time.sleep(0.5)
            slow = []
            for _ in range(count):
                try:
                    connection = socket.create_connection(("127.0.0.1", port), 5, ("127.0.0.2", 0))
                    connection.sendall(FIRST[args.slow])
                    slow.append(connection)
                except OSError:
                    break
            held = good_round(port, body, args.good)
            answers = collections.Counter(answer[:12] for answer in answers_of(slow, args.slow == "headers", args.wait))
            timed_out, refused = answers[b"HTTP/1.1 408"], answers[b"HTTP/1.1 503"] + answers[b""]
            after = good_round(port, body, args.good)
            print(
                f"| {count} (opened {len(slow)}) | {held[0]}/{args.good} | {held[1] * 1e3:.0f} ms | "
                f"{timed_out}/{len(slow)} | {refused}/{len(slow)} | {answers[b'none']}/{len(slow)} | "
                f"{after[0]}/{args.good} |"
            )
        finally:
            os.killpg(server.pid, signal.SIGTERM)  # LitServe's worker processes too: the whole group
            server.wait(timeout=60)


if __name__ == "__main__":
    main()
