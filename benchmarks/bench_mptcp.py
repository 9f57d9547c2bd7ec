"""MPTCP (the kernel's multipath TCP) on the namespace testbed, against the delegates' own
NIC failover (benchmarks/bench_failover.py): how long a stream stalls when a NIC goes down.

Run (root: the namespace testbed): python benchmarks/bench_mptcp.py [--failures 10]

A Testbed of 2 hosts. Every failure gets a fresh MPTCP connection: a receiver in host 1
listens on port P of every address; a sender in host 0 connects from 10.1.0.1 to 10.1.0.2
(rnic0); host 1 announces 10.2.0.2 (an MPTCP `signal` endpoint on rnic1), so host 0's
in-kernel path manager adds a second subflow 10.2.0.1 -> 10.2.0.2 (rnic1). The sender
checks both subflows (MPTCP_INFO and MPTCP_SUBFLOW_ADDRS) before it streams; `ip mptcp
monitor` in host 0 logs the subflows' events as a second witness.

The sender streams numbered 64 KiB messages, one every `--period-ms` (1 ms), each stamped
with CLOCK_MONOTONIC when it is handed to the socket; the receiver stamps each message's
arrival (the clock is shared by the namespaces of one machine). At a seeded random moment
(0.3 to 0.8 s into the stream) the controller takes rnic0 down, of host 0 (the sender's NIC)
or of host 1 (the receiver's), `--failures` times each; the stream goes on `--after-s`
seconds, then ends and the NIC comes up again. Each of the four cases runs with TCP's
minimum retransmission timeout (net.ipv4.tcp_rto_min_us, per namespace) at the kernel's
default and at `--tuned-rto-min-ms`. Per failure:

- first post-failure message: from the down call to the arrival of the first message handed
  over after the call returned (the NIC was down by then);
- largest gap: the longest time without an arrival, from 0.1 s before the failure to the
  end of the stream; stalls: how many gaps there were over 50 ms;
- late messages: how many arrived after the failure more than 5 ms after their hand-over
  (healthy ones take about 0.1 ms), the last one's arrival and the worst latency;
- exactly once, in order: the receiver saw 0, 1, ..., n-1 for the n messages sent;
- bytes: the share of what host 0 sent on rnic1, before and after the failure.

Last, one plain TCP connection over rnic0 with the sender's NIC failing, for reference.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import itertools
import json
import os
import random
import select
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Any

from pipeline.signals import run_script

MESSAGE_BYTES = 1 << 16
HEADER = struct.Struct("<Qd")  # seq, hand-over time (monotonic s)
RECORD = struct.Struct("<Qdd")  # seq, hand-over time, arrival time
IPPROTO_MPTCP = 262
SOL_MPTCP = 284
MPTCP_INFO = 1
MPTCP_SUBFLOW_ADDRS = 3
SENDER, RECEIVER = 0, 1
BASE_PORT = 47000
LATE_S = 0.005
"""A message later than this (hand-over to arrival) is late: healthy ones take ~0.1 ms."""
STALL_S = 0.05
"""A stall: no arrival for this long."""

Row = dict[str, Any]


# --- the processes in the hosts ---------------------------------------------------------


def _stream_socket(mptcp: bool) -> socket.socket:
    return socket.socket(socket.AF_INET, socket.SOCK_STREAM, IPPROTO_MPTCP if mptcp else 0)


def _sockaddr_in(raw: bytes) -> str:
    port = int.from_bytes(raw[2:4], "big")
    return f"{socket.inet_ntoa(raw[4:8])}:{port}"


def subflow_addresses(sock: socket.socket) -> list[str]:
    """The connection's subflows, "local -> remote" (MPTCP_SUBFLOW_ADDRS: Python's getsockopt
    cannot pass the request header in, so through libc)."""
    libc = ctypes.CDLL(None, use_errno=True)
    entry, most = 256, 8  # two sockaddr_storage per subflow
    buffer = ctypes.create_string_buffer(16 + entry * most)
    struct.pack_into("<IIII", buffer, 0, 16, 0, 0, entry)
    length = ctypes.c_uint32(len(buffer))
    if libc.getsockopt(sock.fileno(), SOL_MPTCP, MPTCP_SUBFLOW_ADDRS, buffer, ctypes.byref(length)):
        raise OSError(ctypes.get_errno(), "MPTCP_SUBFLOW_ADDRS")
    _, count, size_kernel, size_user = struct.unpack_from("<IIII", buffer, 0)
    stride = min(size_kernel, size_user) or entry
    raw = buffer.raw
    found = []
    for k in range(min(count, most)):
        at = 16 + k * stride
        found.append(
            f"{_sockaddr_in(raw[at : at + 8])} -> {_sockaddr_in(raw[at + 128 : at + 136])}"
        )
    return found


def extra_subflows(sock: socket.socket) -> int:
    """MPTCP_INFO's mptcpi_subflows: the subflows besides the first."""
    return sock.getsockopt(SOL_MPTCP, MPTCP_INFO, 64)[0]


def _say(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def run_receiver(port: int, out: Path, mptcp: bool) -> None:
    """Accept one connection, stamp every message's arrival; write the records at EOF or on
    SIGTERM."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    records: list[tuple[int, float, float]] = []
    buffer = bytearray(MESSAGE_BYTES)
    view = memoryview(buffer)
    try:
        with _stream_socket(mptcp) as listener:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("0.0.0.0", port))  # every address: the join comes to 10.2.0.2
            listener.listen(1)
            _say(listening=port)
            conn, _ = listener.accept()
        with conn:
            while True:
                got = 0
                while got < MESSAGE_BYTES:
                    n = conn.recv_into(view[got:], MESSAGE_BYTES - got)
                    if n == 0:
                        return
                    got += n
                arrival = time.monotonic()
                seq, handed = HEADER.unpack_from(buffer)
                records.append((seq, handed, arrival))
    finally:
        out.write_bytes(b"".join(RECORD.pack(*r) for r in records))


def run_sender(local: str, address: str, port: int, period_s: float, mptcp: bool) -> None:
    """Connect, check the subflows, stream until "stop" on stdin, then close cleanly."""
    stop = threading.Event()

    def watch_stdin() -> None:
        sys.stdin.readline()
        stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    with _stream_socket(mptcp) as sock:
        sock.bind((local, 0))
        sock.connect((address, port))
        subflows: list[str] = []
        if mptcp:
            deadline = time.monotonic() + 3.0
            while extra_subflows(sock) < 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            subflows = subflow_addresses(sock)
        _say(ready=True, extra_subflows=extra_subflows(sock) if mptcp else 0, subflows=subflows)
        message = bytearray(MESSAGE_BYTES)
        start = time.monotonic()
        seq = 0
        while not stop.is_set():
            delay = start + seq * period_s - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            HEADER.pack_into(message, 0, seq, time.monotonic())
            sock.sendall(message)
            seq += 1
        after = subflow_addresses(sock) if mptcp else []
        sock.shutdown(socket.SHUT_WR)
        sock.settimeout(10.0)
        with contextlib.suppress(OSError):
            while sock.recv(4096):
                pass  # until the receiver has read everything and closed
        _say(sent=seq, subflows_at_end=after)


# --- the controller ---------------------------------------------------------------------


def _ip(bed: Any, host: int, *args: str) -> str:
    done = subprocess.run(
        [*bed.exec_prefix(host), "ip", *args], capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def configure_mptcp(bed: Any) -> list[str]:
    """Per namespace: the limits on both hosts, host 1's rnic1 address announced."""
    commands = [
        (SENDER, ("mptcp", "limits", "set", "subflows", "2", "add_addr_accepted", "2")),
        (RECEIVER, ("mptcp", "limits", "set", "subflows", "2", "add_addr_accepted", "2")),
        (
            RECEIVER,
            ("mptcp", "endpoint", "add", bed.address(RECEIVER, 1), "dev", "rnic1", "signal"),
        ),
    ]
    for host, args in commands:
        _ip(bed, host, *args)
    return [f"host {host}: ip {' '.join(args)}" for host, args in commands]


def _line(stream: IO[str], timeout_s: float, what: str) -> dict[str, Any]:
    ready, _, _ = select.select([stream], [], [], timeout_s)
    line = stream.readline() if ready else ""
    if not line:
        raise RuntimeError(f"{what}: no answer within {timeout_s} s")
    return json.loads(line)


class Children:
    """The processes this benchmark started: each killed by its handle at the end."""

    def __init__(self) -> None:
        self.processes: list[subprocess.Popen[str]] = []

    def start(self, argv: list[str], **kwargs: Any) -> subprocess.Popen[str]:
        process = subprocess.Popen(argv, text=True, **kwargs)
        self.processes.append(process)
        return process

    def stop_all(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(5.0)
        self.processes = []


def _role(bed: Any, host: int, *args: str) -> list[str]:
    return [*bed.exec_prefix(host), sys.executable, str(Path(__file__).resolve()), *args]


def one_failure(
    bed: Any,
    children: Children,
    *,
    failing: int,
    mptcp: bool,
    port: int,
    wait_s: float,
    period_s: float,
    after_s: float,
    folder: Path,
) -> Row:
    """One connection, one failure of rnic0 of host `failing`; its figures."""
    out = folder / f"arrivals-{port}.bin"
    proto = "--mptcp" if mptcp else "--tcp"
    receiver = children.start(
        _role(bed, RECEIVER, "--role", "receive", "--port", str(port), "--out", str(out), proto),
        stdout=subprocess.PIPE,
    )
    monitor_log = folder / f"monitor-{port}.txt"
    with monitor_log.open("w") as log:
        monitor = children.start([*bed.exec_prefix(SENDER), "ip", "mptcp", "monitor"], stdout=log)
    try:
        assert receiver.stdout is not None
        _line(receiver.stdout, 10.0, "receiver")
        sender = children.start(
            _role(
                bed,
                SENDER,
                "--role",
                "send",
                "--from",
                bed.address(SENDER, 0),
                "--to",
                bed.address(RECEIVER, 0),
                "--port",
                str(port),
                "--period-ms",
                str(period_s * 1e3),
                proto,
            ),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert sender.stdout is not None and sender.stdin is not None
        ready = _line(sender.stdout, 10.0, "sender")
        if mptcp and ready["extra_subflows"] < 1:
            raise RuntimeError(f"no second subflow: {ready}")
        marks: dict[str, Any] = {"started": time.monotonic()}
        marks["bytes_start"] = bed.bytes_sent(SENDER)
        time.sleep(wait_s)
        marks["down_at"] = bed.set_link(failing, 0, up=False)
        marks["down_done"] = time.monotonic()  # the NIC is down by now
        marks["bytes_down"] = bed.bytes_sent(SENDER)  # after: a NIC down sends nothing more
        time.sleep(after_s)
        marks["bytes_end"] = bed.bytes_sent(SENDER)
        marks["stop_at"] = time.monotonic()
        sender.stdin.write("stop\n")
        sender.stdin.flush()
        try:  # MPTCP drains what it holds; plain TCP never will
            done = _line(sender.stdout, 15.0 if mptcp else 1.0, "sender's end")
        except RuntimeError:
            done = {"sent": None, "subflows_at_end": []}  # stuck in sendall: plain TCP
            sender.kill()
        sender.wait(5.0)
        try:
            receiver.wait(3.0)
        except subprocess.TimeoutExpired:
            receiver.terminate()  # it writes what it has
            receiver.wait(5.0)
    finally:
        bed.set_link(failing, 0, up=True)
        monitor.kill()
        monitor.wait(5.0)
    records = [
        RECORD.unpack_from(raw, at)
        for raw in [out.read_bytes()]
        for at in range(0, len(raw), RECORD.size)
    ]
    return _figures(records, marks, done, ready, monitor_log.read_text())


def _figures(
    records: list[tuple[int, float, float]],
    marks: dict[str, Any],
    done: dict[str, Any],
    ready: dict[str, Any],
    monitor: str,
) -> Row:
    started, down_at = marks["started"], marks["down_at"]
    seqs = [seq for seq, _, _ in records]
    sent = done["sent"]
    after = [r for r in records if r[1] > marks["down_done"]]
    first = min(after, key=lambda r: r[2]) if after else None
    healthy = [a - h for _, h, a in records if h < down_at - 0.05 and h > started]
    arrivals = sorted(a for _, _, a in records if a >= down_at - 0.1)
    ends = [down_at - 0.1, *arrivals, max([marks["stop_at"], *arrivals])]
    gaps = [b - a for a, b in itertools.pairwise(ends)]
    window = [r for r in records if r[1] >= down_at - 0.1]
    late = [a for _, h, a in window if a - h > LATE_S and a > down_at]
    stalls = sum(gap > STALL_S for gap in gaps)
    start, down, end = (marks[k] for k in ("bytes_start", "bytes_down", "bytes_end"))
    before = {nic: down[nic] - start[nic] for nic in ("rnic0", "rnic1")}
    later = {nic: end[nic] - down[nic] for nic in ("rnic0", "rnic1")}
    return {
        "first_after_ms": (first[2] - down_at) * 1e3 if first else None,
        "last_late_ms": (max(late) - down_at) * 1e3 if late else None,
        "late_messages": len(late),
        "stalls": stalls,
        "largest_gap_ms": max(gaps, default=0.0) * 1e3,
        "first_latency_ms": (first[2] - first[1]) * 1e3 if first else None,
        "max_latency_ms": max((a - h for _, h, a in window), default=0.0) * 1e3,
        "healthy_latency_ms": statistics.median(healthy) * 1e3 if healthy else None,
        "exactly_once_in_order": sent is not None and seqs == list(range(sent)),
        "received": len(seqs),
        "sent": sent,
        "rnic1_share_before": before["rnic1"] / max(1, sum(before.values())),
        "rnic1_share_after": later["rnic1"] / max(1, sum(later.values())),
        "bytes_before": before,
        "bytes_after": later,
        "subflows": ready.get("subflows", []),
        "subflows_at_end": done.get("subflows_at_end", []),
        "monitor_sf_established": monitor.count("SF_ESTABLISHED"),
        "monitor_sf_closed": monitor.count("SF_CLOSED"),
    }


def _cell(rows: list[Row], key: str, scale: float = 1.0, digits: int = 1) -> str:
    values = [row[key] * scale for row in rows if row[key] is not None]
    missing = sum(row[key] is None for row in rows)
    if not values:
        return "none"
    text = f"{statistics.median(values):.{digits}f} / {max(values):.{digits}f}"
    return text + (f" ({missing} none)" if missing else "")


def _set_rto_min(bed: Any, rto_min_us: int) -> None:
    """TCP's minimum retransmission timeout (per namespace; MPTCP's subflows are TCP)."""
    for host in (SENDER, RECEIVER):
        subprocess.run(
            [*bed.exec_prefix(host), "sysctl", "-qw", f"net.ipv4.tcp_rto_min_us={rto_min_us}"],
            check=True,
        )


def controller(args: argparse.Namespace) -> None:
    from injectors.testbed import Testbed

    if os.geteuid() != 0:
        sys.exit("the testbed needs root")
    rng = random.Random(args.seed)
    print(f"kernel {os.uname().release}; load average before: {os.getloadavg()[0]:.2f}")
    children = Children()
    results: dict[str, list[Row]] = {}
    port = BASE_PORT
    default_us = int(Path("/proc/sys/net/ipv4/tcp_rto_min_us").read_text())
    cases = []
    for rto_min_us in (default_us, round(args.tuned_rto_min_ms * 1e3)):
        if rto_min_us <= 0:
            continue
        rto = f"rto_min {rto_min_us / 1e3:g} ms"
        for failing, whose in ((SENDER, "sender's"), (RECEIVER, "receiver's")):
            cases.append((f"MPTCP, {rto}, {whose} rnic0 down", failing, True, rto_min_us))
    if not args.no_tcp:
        cases.append(
            (
                f"plain TCP, rto_min {default_us / 1e3:g} ms, sender's rnic0 down",
                SENDER,
                False,
                default_us,
            )
        )
    try:
        with Testbed(2) as bed, tempfile.TemporaryDirectory() as folder:
            print(f"testbed {bed.name}")
            for line in configure_mptcp(bed):
                print(f"  {line}")
            for name, failing, mptcp, rto_min_us in cases:
                _set_rto_min(bed, rto_min_us)
                rows = results.setdefault(name, [])
                for _ in range(args.failures if mptcp else 1):
                    port += 1
                    row = one_failure(
                        bed,
                        children,
                        failing=failing,
                        mptcp=mptcp,
                        port=port,
                        wait_s=rng.uniform(0.3, 0.8),
                        period_s=args.period_ms / 1e3,
                        after_s=args.after_s,
                        folder=Path(folder),
                    )
                    rows.append(row)
                    print(json.dumps({"case": name, **row}), flush=True)
    finally:
        children.stop_all()
    _report(results, args)
    print(f"load average after: {os.getloadavg()[0]:.2f}")


def _report(results: dict[str, list[Row]], args: argparse.Namespace) -> None:
    print(
        f"\n(median / max per failure; a message every {args.period_ms} ms, 64 KiB; "
        f"the stream ran {args.after_s} s past each failure; late: over {LATE_S * 1e3:g} ms)"
    )
    print(
        "| case | failures | first post-failure message ms | largest gap ms | "
        f"stalls over {STALL_S * 1e3:g} ms | late messages | last late arrival ms | "
        "worst latency ms | healthy latency ms | exactly once, in order | "
        "host 0 bytes on rnic1 before / after |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, rows in results.items():
        ok = sum(bool(row["exactly_once_in_order"]) for row in rows)
        before = statistics.median(row["rnic1_share_before"] for row in rows)
        after = statistics.median(row["rnic1_share_after"] for row in rows)
        print(
            f"| {name} | {len(rows)} | {_cell(rows, 'first_after_ms')} | "
            f"{_cell(rows, 'largest_gap_ms')} | {_cell(rows, 'stalls', digits=0)} | "
            f"{_cell(rows, 'late_messages', digits=0)} | {_cell(rows, 'last_late_ms')} | "
            f"{_cell(rows, 'max_latency_ms')} | {_cell(rows, 'healthy_latency_ms', digits=2)} | "
            f"{ok}/{len(rows)} | {before:.0%} / {after:.0%} |"
        )
    closed = sum(row["monitor_sf_closed"] for rows in results.values() for row in rows)
    kept = sum(len(row["subflows_at_end"]) == 2 for rows in results.values() for row in rows)
    joined = sum(
        row["monitor_sf_established"] == 1 and len(row["subflows"]) == 2
        for rows in results.values()
        for row in rows
    )
    print(
        f"second subflow seen (MPTCP_INFO, MPTCP_SUBFLOW_ADDRS and ip mptcp monitor) in "
        f"{joined} MPTCP connections; SF_CLOSED events: {closed}; both subflows still there "
        f"at the end in {kept}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--failures", type=int, default=10, help="per failing host")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--period-ms", type=float, default=1.0)
    parser.add_argument("--after-s", type=float, default=2.0)
    parser.add_argument(
        "--tuned-rto-min-ms", type=float, default=5.0, help="the tuned cases' rto_min (0: none)"
    )
    parser.add_argument("--no-tcp", action="store_true", help="skip the plain TCP reference")
    parser.add_argument("--role", choices=("controller", "send", "receive"), default="controller")
    parser.add_argument("--port", type=int)
    parser.add_argument("--from", dest="local")
    parser.add_argument("--to")
    parser.add_argument("--out", type=Path)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--mptcp", dest="mptcp", action="store_true", default=True)
    group.add_argument("--tcp", dest="mptcp", action="store_false")
    args = parser.parse_args()
    try:
        if args.role == "send":
            run_sender(args.local, args.to, args.port, args.period_ms / 1e3, args.mptcp)
        elif args.role == "receive":
            run_receiver(args.port, args.out, args.mptcp)
        else:
            controller(args)
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    run_script(main)
