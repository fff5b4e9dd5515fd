"""How many slow clients one `make serve` survives: good requests answered while K connections trickle bodies.

For a bake installed in this Python, the script starts ``python -m <package>.serve`` on a loopback
port with the server's file-descriptor limit set to ``--nofile`` (``ulimit -n``, 1024 by default,
a common default), then for each K opens K connections that send their headers and the start of
a body and nothing more (the client's own limit is raised to the hard limit). While they are held,
it sends ``--good`` good requests one after another (a fresh connection each, 10 s timeout) and
counts those answered 200; then it waits past ``--body_timeout`` and sends the good requests again
(recovery). Each slow connection is also read to see what it got (408 at its deadline, or a reset).

    python docs/bench_slow_clients.py digits_classifier /path/to/best.ckpt --counts 250 500 900 2000

Prints one Markdown table row per K.
"""

import argparse
import contextlib
import functools
import json
import resource
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

HEAD = b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("package")
    parser.add_argument("ckpt")
    parser.add_argument("--counts", type=int, nargs="+", default=[250, 500, 900, 2000])
    parser.add_argument("--nofile", type=int, default=1024)
    parser.add_argument("--body_timeout", type=float, default=10.0)
    parser.add_argument("--good", type=int, default=20)
    args = parser.parse_args()
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    body = json.dumps({"inputs": [[[0.0] * 8] * 8]}).encode()  # a digits example (1, 8, 8) as JSON
    body = json.dumps({"inputs": [json.loads(body)["inputs"]]}).encode()
    print(
        f"| slow connections (server ulimit -n {args.nofile}, --body_timeout {args.body_timeout:g}) "
        "| good answered while held | p50 | slow ones answered 408 | good answered after the timeout |"
    )
    print("|---|---|---|---|---|")
    for count in args.counts:
        port = free_port()
        command = [sys.executable, "-m", f"{args.package}.serve", "--ckpt", args.ckpt, "--port", str(port)]
        command += ["--body_timeout", str(args.body_timeout)]
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
                    connection = socket.create_connection(("127.0.0.1", port), timeout=5)
                    connection.sendall(HEAD + b'{"inputs": [')
                    slow.append(connection)
                except OSError:
                    break
            held = good_round(port, body, args.good)
            timed_out = 0
            for connection in slow:
                connection.settimeout(args.body_timeout + 30)
                with contextlib.suppress(OSError):
                    timed_out += connection.recv(64).startswith(b"HTTP/1.1 408")
                connection.close()
            after = good_round(port, body, args.good)
            print(
                f"| {count} (opened {len(slow)}) | {held[0]}/{args.good} | {held[1] * 1e3:.0f} ms | "
                f"{timed_out}/{len(slow)} | {after[0]}/{args.good} |"
            )
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=60)


if __name__ == "__main__":
    main()
