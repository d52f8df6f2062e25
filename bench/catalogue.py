"""The marketplace catalogue grown to 10,000 projects: ``GET /carbonProjects?country=…&category=…``
and ``GET /carbonProjects/{key}`` against a bare aiohttp JSON endpoint, in the same run,
everything on loopback. Target: each at least 0.40 of the bare endpoint's requests a second.

One run:
1. a private anvil (one block per transaction) with the reference protocol deployed and
   seeded, and a scratch database;
2. the catalogue: the 648 real projects of ``data/carbon-projects.json`` and, up to
   ``--projects``, generated ones (seeded RNG, ``--seed``): registry ``BENCH``, keys
   ``BENCH-1``, ``BENCH-2``, …, each copying the country, region, description, SDGs and
   coordinates (jittered) of a real project drawn at random, so countries and categories keep
   the data set's skew; one in five takes a category drawn from the data set's category
   frequencies instead (with methodologies of a real project of that category), so more
   country/category pairs exist. Every record passes ``parse_record``. Written to a temporary
   file and loaded with ``relayer catalogue load --file`` (timed);
3. the daemon as deployed for the API (``relayer serve``) in a process of its own;
4. the request mix, fixed by the seed: for the list, country/category pairs drawn by how many
   projects they hold (default page size; one in five, when the pair has more than a page,
   with an ``offset`` of a later page); for the detail, keys drawn uniformly from all the
   projects (most are not in the per-snapshot cache when first asked). Every distinct list request
   and a sample of detail requests are checked first (200, ``X-Total-Count`` and the page as
   the generated catalogue says, the right project), which also gives the mean list body
   size;
5. the bare endpoints, as in ``bench/read_path.py``: aiohttp servers in processes of their
   own answering with ``web.json_response`` of a fixed JSON array of project items exactly as
   long as the mean answer they stand beside (``bare``: the list's, about 32 kB;
   ``bareDetail``: the detail's, about 2 kB), compact as the daemon writes, serialized for
   every request; the target is judged against them. Beside each, ``…Prerendered``: the same
   text encoded once at start (what the daemon sends for an answer in its cache), the ceiling
   of aiohttp itself here, reported with its ratio but not judged;
6. the client: ``wrk`` (``--client auto`` uses it when it is on the PATH; ``apt-get install
   wrk``) with ``bench/catalogue.lua`` cycling through the mix, or a closed loop of aiohttp
   requests in this process; ``--concurrency`` connections, a warm-up of ``--warmup`` seconds
   (not counted), then ``--duration`` seconds measured, against the bare endpoints (the list
   mix), the list mix and the detail mix in turn, with the same settings.

Everything it started (anvil, the daemon, the bare servers, wrk) is stopped and the scratch
database dropped also when it fails, is interrupted (Ctrl-C) or gets SIGTERM.

Prints, per target, answers a second, p50 and p99 latency, errors (answers other than 200 and
failed requests), the server's CPU a request, the client's CPU and a warning when other
processes kept the machine busy during a target; then the ratios and one JSON line:
``{"projects", "loadSeconds", "bare": {"rps", "p50Ms", "p99Ms", "errors", "cpuMsPerRequest",
"meanBytes"}, "barePrerendered": {…}, "list": {…}, "bareDetail": {…},
"bareDetailPrerendered": {…}, "detail": {…}, "ratioList",
"ratioListPrerendered", "ratioDetail", "ratioDetailPrerendered", "target", "targetMet",
"client", "concurrency", "durationSeconds"}`` (``targetMet``: the list's ratio to ``bare`` and
the detail's to ``bareDetail`` at least ``target``, and no error).

The machine's other work shows in the figures: a target during which other processes kept
more than a quarter of a core busy is named in a warning.

    .venv/bin/python bench/catalogue.py      # defaults: --projects 10000 --concurrency 50 --duration 10
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final
from urllib.parse import quote, urlencode

import aiohttp
from yarl import URL

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    RELAYER,
    cpu_seconds,
    daemon_env,
    free_port,
    in_scratch_database,
    machine_cpu_seconds,
    start_daemon,
    stop_processes,
    wait_ready,
)
from relayer.domain.projects import CATEGORIES, parse_record  # noqa: E402
from relayer_dev import devnet  # noqa: E402
from relayer_dev.deploy import deploy_and_seed  # noqa: E402

CHAIN_ID: Final = 84532
TARGET_RATIO: Final = 0.40
PAGE_SIZE: Final = 20  # the API's default limit
BENCH_REGISTRY: Final = "BENCH"
OTHER_CATEGORY_SHARE: Final = 0.2  # generated projects whose category is not their model's
OFFSET_SHARE: Final = 0.2  # list requests asking for a later page (when the pair has one)
LIST_MIX: Final = 5_000  # list requests in the fixed mix (cycled through)
DETAIL_MIX: Final = 20_000  # detail requests in the fixed mix
DETAIL_CHECKS: Final = 200  # detail requests checked before measuring
LOAD_TIMEOUT_S: Final = 600.0
REQUEST_TIMEOUT_S: Final = 10.0
READY_TIMEOUT_S: Final = 60.0
STOP_TIMEOUT_S: Final = 30.0
# CPU the rest of the machine may use in a window (cores) before its figures are flagged
OTHERS_WARN_CORES: Final = 0.25
WRK_SCRIPT: Final = Path(__file__).resolve().with_name("catalogue.lua")
WRK_MARK: Final = "WRK_JSON "

# The bare endpoint: both paths, the JSON array of the file it is given as its body, no access
# log. Mode "json" serializes it for every request as a JSON endpoint does (compact, as the
# daemon writes); mode "bytes" answers the same text encoded once (what the daemon does for a
# page in its cache: the ceiling of aiohttp itself).
BARE_SERVER: Final = """
import json
import sys
from functools import partial

from aiohttp import web

BODY = json.loads(open(sys.argv[1], "rb").read())
dumps = partial(json.dumps, separators=(",", ":"), ensure_ascii=False)
ENCODED = dumps(BODY).encode()


async def answer_json(request: web.Request) -> web.Response:
    return web.json_response(BODY, dumps=dumps)


async def answer_bytes(request: web.Request) -> web.Response:
    return web.Response(body=ENCODED, content_type="application/json")


answer = answer_json if sys.argv[3] == "json" else answer_bytes
app = web.Application()
app.router.add_get("/carbonProjects", answer)
app.router.add_get("/carbonProjects/{key}", answer)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[2]), access_log=None, print=None)
"""


# ---------------------------------------------------------------------------- the catalogue


def generate(real: list[dict[str, Any]], count: int, seed: int) -> list[dict[str, Any]]:
    """``count`` synthetic records ``BENCH-1`` … modelled on random real ones (see the module's
    docstring), each checked with ``parse_record``.

    Raises:
        SystemExit: a generated record does not pass ``parse_record`` (a bug here).
    """
    rng = random.Random(seed)
    by_category: dict[str, list[dict[str, Any]]] = {c: [] for c in CATEGORIES}
    for r in real:
        by_category[r["category"]].append(r)
    categories = [r["category"] for r in real]
    out: list[dict[str, Any]] = []
    for n in range(1, count + 1):
        model = rng.choice(real)
        category = model["category"] if rng.random() >= OTHER_CATEGORY_SHARE else rng.choice(categories)
        method_model = model if category == model["category"] else rng.choice(by_category[category])
        years = min(len(model["vintages"]), 30)
        first = rng.randint(1995, 2025 - years)
        latitude, longitude = model["latitude"], model["longitude"]
        if latitude is not None and longitude is not None:
            latitude = max(-90.0, min(90.0, round(latitude + rng.uniform(-0.5, 0.5), 6)))
            longitude = max(-180.0, min(180.0, round(longitude + rng.uniform(-0.5, 0.5), 6)))
        key = f"{BENCH_REGISTRY}-{n}"
        record = {
            "key": key,
            "registry": BENCH_REGISTRY,
            "projectID": str(n),
            "name": f"Bench project {n} after {model['name']}",
            "country": model["country"],
            "region": model["region"],
            "methodologies": [dict(m) for m in method_model["methodologies"]],
            "category": category,
            "vintages": [str(y) for y in range(first, first + years)],
            "latitude": latitude,
            "longitude": longitude,
            "url": f"https://bench.invalid/projects/{key}" if model["url"] else "",
            "sdgs": sorted(rng.sample([str(g) for g in range(1, 18)], len(set(model["sdgs"]))), key=int),
            "description": model["description"],
            "source": f"synthetic: bench/catalogue.py seed {seed}, modelled on {model['key']}",
        }
        try:
            parse_record(record)
        except ValueError as exc:
            raise SystemExit(f"generated record {key} is not valid: {exc}") from None
        out.append(record)
    return out


@dataclass(frozen=True)
class Mix:
    """The fixed request mix and what the generated catalogue says each list answer holds."""

    lists: list[str]  # paths with their query
    details: list[str]
    totals: dict[str, tuple[int, int]]  # list path -> (X-Total-Count, items on the page)
    keys: dict[str, str]  # detail path -> the project's key


def request_mix(records: list[dict[str, Any]], seed: int) -> Mix:
    """The list and detail paths of the run (see the module's docstring), fixed by ``seed``."""
    rng = random.Random(seed + 1)
    pairs = Counter((r["country"], r["category"]) for r in records)
    # the API matches country and category case-insensitively: a page holds every spelling
    matching = Counter((r["country"].lower(), r["category"].lower()) for r in records)
    names = list(pairs)
    lists: list[str] = []
    totals: dict[str, tuple[int, int]] = {}
    for country, category in rng.choices(names, [pairs[p] for p in names], k=LIST_MIX):
        total = matching[(country.lower(), category.lower())]
        query = {"country": country, "category": category}
        offset = 0
        if total > PAGE_SIZE and rng.random() < OFFSET_SHARE:
            offset = PAGE_SIZE * rng.randint(1, (total - 1) // PAGE_SIZE)
            query["offset"] = str(offset)
        path = "/carbonProjects?" + urlencode(query, quote_via=quote)
        lists.append(path)
        totals[path] = (total, min(PAGE_SIZE, total - offset))
    keys = [r["key"] for r in records]
    details: list[str] = []
    by_path: dict[str, str] = {}
    for key in rng.choices(keys, k=DETAIL_MIX):
        path = "/carbonProjects/" + quote(key, safe="")
        details.append(path)
        by_path[path] = key
    return Mix(lists, details, totals, by_path)


def load_catalogue(path: Path, env: dict[str, str], expected: int) -> float:
    """``relayer catalogue load --file path``: its wall time, seconds.

    Raises:
        SystemExit: the command failed or did not read ``expected`` projects.
    """
    t0 = time.perf_counter()
    done = subprocess.run(
        [str(RELAYER), "catalogue", "load", "--file", str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=LOAD_TIMEOUT_S,
        check=False,
    )
    seconds = time.perf_counter() - t0
    if done.returncode != 0 or f"{expected} projects read" not in done.stdout:
        raise SystemExit(
            f"relayer catalogue load exited {done.returncode}: {done.stdout[-2000:]} {done.stderr[-2000:]}"
        )
    print(f"{done.stdout.strip()} in {seconds:.2f} s (relayer catalogue load --file)", flush=True)
    return seconds


# ---------------------------------------------------------------------------- checks


async def check(base: str, mix: Mix, seed: int) -> tuple[float, float, list[dict[str, Any]]]:
    """Every distinct list request and :data:`DETAIL_CHECKS` detail requests, once each.

    Returns:
        The mean list body and the mean detail body (bytes, weighted as the mix asks for
        them), and the items of the list answers (to build the bare body from).

    Raises:
        SystemExit: an answer is not 200 or not what the generated catalogue says.
    """
    sizes: dict[str, int] = {}
    items: list[dict[str, Any]] = []
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def get(path: str) -> tuple[bytes, Any, str | None]:
            """The body, its JSON and the X-Total-Count header of a 200 answer."""
            async with session.get(URL(base + path, encoded=True)) as r:
                body = await r.read()
                if r.status != 200:
                    raise SystemExit(f"GET {path} answered {r.status}: {body[:2000]!r}")
                return body, json.loads(body), r.headers.get("X-Total-Count")

        for path, (total, count) in mix.totals.items():
            body, answer, given = await get(path)
            if not isinstance(answer, list) or len(answer) != count or given != str(total):
                raise SystemExit(
                    f"GET {path}: {len(answer)} items, X-Total-Count {given}; expected {count} of {total}"
                )
            sizes[path] = len(body)
            items.extend(answer)
        sample = random.Random(seed + 2).sample(sorted(set(mix.details)), DETAIL_CHECKS)
        detail_sizes = []
        for path in sample:
            body, answer, _ = await get(path)
            key = mix.keys[path]
            if not (isinstance(answer, dict) and answer.get("key") == key and "listings" in answer):
                raise SystemExit(f"GET {path} is not project {key}: {body[:500]!r}")
            detail_sizes.append(len(body))
    mean_list = sum(sizes[p] for p in mix.lists) / len(mix.lists)
    return mean_list, sum(detail_sizes) / len(detail_sizes), items


def bare_body(items: list[dict[str, Any]], size: int) -> list[dict[str, Any]]:
    """A JSON array of project items whose compact text is ``size`` bytes (the last item's
    ``description`` padded or cut to make it exact)."""

    def length(value: Any) -> int:
        return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())

    body: list[dict[str, Any]] = []
    for item in itertools.cycle(items):
        if length([*body, item]) > size:
            break
        body.append(item)
    if not body:  # one item is longer than the answer (the detail): one item, cut to size
        body.append(items[0])
    last = dict(body.pop())
    last["description"] = ""
    room = size - length([*body, last])
    last["description"] = "x" * max(0, room)
    body.append(last)
    if length(body) != size:  # the item alone is larger than the room left: near enough
        print(f"bare body is {length(body)} bytes for a mean of {size}", flush=True)
    return body


# ---------------------------------------------------------------------------- measuring


@dataclass
class Result:
    """What a target's measured window gave."""

    seconds: float = 0.0
    ok: int = 0
    errors: int = 0
    statuses: dict[str, int] = field(default_factory=dict)
    received: int = 0  # bytes read by the client (wrk: headers included)
    p50_ms: float = float("nan")
    p99_ms: float = float("nan")
    server_cpu: float = 0.0
    client_cpu: float = 0.0
    machine_cpu: float = 0.0  # every process's CPU over the window, seconds

    @property
    def rps(self) -> float:
        return self.ok / self.seconds if self.seconds > 0 else 0.0

    @property
    def others_cores(self) -> float:
        """Cores the rest of the machine (neither the server nor the client) kept busy."""
        if self.seconds <= 0:
            return 0.0
        return max(0.0, self.machine_cpu - self.server_cpu - self.client_cpu) / self.seconds

    def per_request_ms(self, cpu: float) -> float:
        return 1000 * cpu / self.ok if self.ok else float("nan")


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


async def wrk(base: str, paths: Path, args: argparse.Namespace, seconds: int) -> dict[str, Any]:
    """One wrk run over the paths of ``paths``: the figures its script prints. wrk is killed
    when this is cancelled or fails."""
    argv = ["wrk", "-t", str(args.threads), "-c", str(args.concurrency), "-d", f"{seconds}s"]
    argv += ["--timeout", f"{REQUEST_TIMEOUT_S:.0f}s", "-s", str(WRK_SCRIPT), base, "--", str(paths)]
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), seconds + 60)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    stdout, stderr = out.decode(errors="replace"), err.decode(errors="replace")
    lines = [line for line in stdout.splitlines() if line.startswith(WRK_MARK)]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"wrk exited {proc.returncode}: {stdout[-2000:]} {stderr[-2000:]}")
    figures: dict[str, Any] = json.loads(lines[-1].removeprefix(WRK_MARK))
    return figures


async def measure_wrk(base: str, paths: Path, pid: int, args: argparse.Namespace) -> Result:
    """A warm-up run, then the measured one, with the server ``pid``'s CPU over it."""
    if args.warmup > 0:
        await wrk(base, paths, args, args.warmup)
    cpu0, client0, machine0 = cpu_seconds(pid), children_cpu_seconds(), machine_cpu_seconds()
    figures = await wrk(base, paths, args, args.duration)
    result = Result(
        seconds=figures["durationUs"] / 1e6,
        server_cpu=cpu_seconds(pid) - cpu0,
        client_cpu=children_cpu_seconds() - client0,
        machine_cpu=machine_cpu_seconds() - machine0,
    )
    failed = {
        "not 2xx/3xx": figures["statusErrors"],
        "connect": figures["connectErrors"],
        "read": figures["readErrors"],
        "write": figures["writeErrors"],
        "timeout": figures["timeouts"],
    }
    result.statuses = {k: v for k, v in failed.items() if v}
    result.ok = figures["requests"] - figures["statusErrors"]
    result.received = figures["bytes"]
    result.errors = sum(failed.values())
    result.p50_ms, result.p99_ms = figures["p50Us"] / 1000, figures["p99Us"] / 1000
    return result


async def measure_aiohttp(base: str, paths: list[str], pid: int, args: argparse.Namespace) -> Result:
    """A closed loop of ``--concurrency`` requests in flight, cycling through ``paths``; what
    completes in the window after the warm-up counts."""
    result = Result()
    latencies: list[float] = []
    measuring = False
    stop = False
    urls = itertools.cycle([URL(base + p, encoded=True) for p in paths])
    connector = aiohttp.TCPConnector(limit=args.concurrency)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def worker() -> None:
            while not stop:
                t0 = time.perf_counter()
                size = 0
                try:
                    async with session.get(next(urls)) as r:
                        size = len(await r.read())
                        status = str(r.status)
                except (aiohttp.ClientError, TimeoutError) as exc:
                    status = type(exc).__name__
                if not measuring:
                    continue
                result.statuses[status] = result.statuses.get(status, 0) + 1
                if status == "200":
                    result.ok += 1
                    result.received += size
                    latencies.append(time.perf_counter() - t0)
                else:
                    result.errors += 1

        workers = [asyncio.create_task(worker()) for _ in range(args.concurrency)]
        try:
            await asyncio.sleep(args.warmup)
            cpu0, client0, machine0 = cpu_seconds(pid), time.process_time(), machine_cpu_seconds()
            t0 = time.perf_counter()
            measuring = True
            await asyncio.sleep(args.duration)
            measuring = False
            result.seconds = time.perf_counter() - t0
            result.server_cpu = cpu_seconds(pid) - cpu0
            result.client_cpu = time.process_time() - client0
            result.machine_cpu = machine_cpu_seconds() - machine0
            stop = True
            await asyncio.wait_for(asyncio.gather(*workers), REQUEST_TIMEOUT_S + 5)
        finally:
            for w in workers:
                w.cancel()
    result.statuses = {k: v for k, v in result.statuses.items() if k != "200"}
    if latencies:
        ordered = sorted(latencies)
        result.p50_ms = 1000 * ordered[len(ordered) // 2]
        result.p99_ms = 1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    return result


def start_bare(body: Path, port: int, mode: str, log: Path) -> subprocess.Popen[bytes]:
    """The bare endpoint (``mode``: ``json`` or ``bytes``) on ``port``, answering ``body``."""
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-c", BARE_SERVER, str(body), str(port), mode],
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def figures(result: Result, mean_bytes: float) -> dict[str, Any]:
    return {
        "rps": round(result.rps, 1),
        "p50Ms": round(result.p50_ms, 2),
        "p99Ms": round(result.p99_ms, 2),
        "errors": result.errors,
        "cpuMsPerRequest": round(result.per_request_ms(result.server_cpu), 3),
        "meanBytes": round(mean_bytes),
    }


# ---------------------------------------------------------------------------- the run


async def run(args: argparse.Namespace, state: Path, dsn: str) -> None:
    log, bare_log = state / "daemon.log", state / "bare.log"
    anvil_port = free_port()
    anvil = devnet.start_anvil(state, anvil_port, CHAIN_ID)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        t0 = time.perf_counter()
        info = deploy_and_seed(devnet.rpc_url(anvil_port), CHAIN_ID, devnet.DEFAULT_PROJECTS_FILE)
        (state / "devnet.json").write_text(json.dumps(info))
        print(f"devnet deployed and seeded in {time.perf_counter() - t0:.1f} s", flush=True)

        real = json.loads(devnet.DEFAULT_PROJECTS_FILE.read_text())
        t0 = time.perf_counter()
        records = real + generate(real, args.projects - len(real), args.seed)
        catalogue_file = state / "catalogue.json"
        catalogue_file.write_text(json.dumps(records, ensure_ascii=False))
        pairs = len({(r["country"], r["category"]) for r in records})
        countries = len({r["country"] for r in records})
        print(
            f"catalogue: {len(real)} real + {len(records) - len(real)} generated projects, "
            f"{countries} countries, {pairs} country/category pairs, "
            f"{catalogue_file.stat().st_size / 1e6:.1f} MB, made in {time.perf_counter() - t0:.1f} s",
            flush=True,
        )
        base_env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp")}
        load_s = load_catalogue(catalogue_file, {**base_env, "RELAYER_DATABASE_URL": dsn}, len(records))

        http_port = free_port()
        daemon_url = f"http://127.0.0.1:{http_port}"
        env = daemon_env(dsn, info, state / "devnet.json", http_port)
        daemon = start_daemon("serve", env, log, Path(args.profile) if args.profile else None)
        procs.append(daemon)
        await wait_ready(f"{daemon_url}/readyz", [daemon], log, READY_TIMEOUT_S)

        mix = request_mix(records, args.seed)
        t0 = time.perf_counter()
        mean_list, mean_detail, items = await check(daemon_url, mix, args.seed)
        print(
            f"checked {len(mix.totals)} distinct list requests and {DETAIL_CHECKS} detail requests in "
            f"{time.perf_counter() - t0:.1f} s: mean list answer {mean_list:.0f} bytes, "
            f"mean detail answer {mean_detail:.0f} bytes",
            flush=True,
        )
        # One bare endpoint per answer size: the list's mean (about 32 kB) and the detail's (about
        # 2 kB), each serializing per request ("bare", what the target is judged against) and
        # answering bytes encoded once ("…Prerendered", aiohttp's own ceiling).
        bares: dict[str, tuple[str, int]] = {}
        for size_name, size in (("", mean_list), ("Detail", mean_detail)):
            body_file = state / f"bare{size_name}.json"
            body_file.write_text(json.dumps(bare_body(items, round(size)), ensure_ascii=False))
            for label, mode in (("", "json"), ("Prerendered", "bytes")):
                name = f"bare{size_name}{label}"
                port = free_port()
                bare = start_bare(body_file, port, mode, bare_log)
                procs.append(bare)
                bares[name] = (f"http://127.0.0.1:{port}", bare.pid)
                await wait_ready(f"{bares[name][0]}/carbonProjects", [bare], bare_log, READY_TIMEOUT_S)

        lists_file, details_file = state / "lists.txt", state / "details.txt"
        lists_file.write_text("\n".join(mix.lists) + "\n")
        details_file.write_text("\n".join(mix.details) + "\n")
        plan = [
            ("bare", *bares["bare"], lists_file, mix.lists, mean_list),
            ("barePrerendered", *bares["barePrerendered"], lists_file, mix.lists, mean_list),
            ("list", daemon_url, daemon.pid, lists_file, mix.lists, mean_list),
            ("bareDetail", *bares["bareDetail"], details_file, mix.details, mean_detail),
            (
                "bareDetailPrerendered",
                *bares["bareDetailPrerendered"],
                details_file,
                mix.details,
                mean_detail,
            ),
            ("detail", daemon_url, daemon.pid, details_file, mix.details, mean_detail),
        ]
        results: dict[str, Result] = {}
        summary: dict[str, Any] = {"projects": len(records), "loadSeconds": round(load_s, 2)}
        for name, base, pid, paths_file, paths, mean_bytes in plan:
            if args.client == "wrk":
                result = await measure_wrk(base, paths_file, pid, args)
            else:
                result = await measure_aiohttp(base, paths, pid, args)
            results[name] = result
            summary[name] = figures(result, mean_bytes)
            print(
                f"{name:15} {result.rps:8.1f} req/s  p50 {result.p50_ms:6.2f} ms  "
                f"p99 {result.p99_ms:6.2f} ms  {result.received / max(1, result.ok):6.0f} bytes an answer  "
                f"errors {result.errors}"
                + (f" {result.statuses}" if result.errors else "")
                + f"  CPU a request: server {result.per_request_ms(result.server_cpu):.3f} ms, "
                f"client {result.per_request_ms(result.client_cpu):.3f} ms "
                f"(client busy {100 * result.client_cpu / result.seconds:.0f} %, "
                f"other processes {result.others_cores:.2f} cores)",
                flush=True,
            )

        ratios: dict[str, float] = {}
        for name, bare_of in (("list", "bare"), ("detail", "bareDetail")):
            r = results[name]
            for bare_name, label in ((bare_of, ""), (bare_of + "Prerendered", "Prerendered")):
                b = results[bare_name]
                ratio = r.rps / b.rps if b.rps else 0.0
                ratios[f"ratio{name.title()}{label}"] = ratio
                print(
                    f"{name}: {r.rps:.1f} / {b.rps:.1f} req/s = {ratio:.2f} of the {bare_name} endpoint"
                    + (
                        f" ({'meets' if ratio >= TARGET_RATIO else 'misses'} the {TARGET_RATIO:.2f} target)"
                        if label == ""
                        else ""
                    )
                    + f"; p99 {r.p99_ms:.2f} ms against {b.p99_ms:.2f} ms",
                    flush=True,
                )
        errors = sum(r.errors for r in results.values())
        met = min(ratios["ratioList"], ratios["ratioDetail"]) >= TARGET_RATIO and errors == 0
        print(
            f"target (list and detail >= {TARGET_RATIO:.2f} of the bare endpoint's req/s, no error): "
            f"{'met' if met else 'NOT met'}; client {args.client}, concurrency {args.concurrency}, "
            f"{args.duration} s a target after {args.warmup} s of warm-up; the machine has "
            f"{os.cpu_count()} cores for the client, both servers, anvil and Postgres",
            flush=True,
        )
        busy = {k: r.others_cores for k, r in results.items() if r.others_cores > OTHERS_WARN_CORES}
        if busy:
            print(
                "WARNING: other processes kept "
                + ", ".join(f"{v:.2f} cores busy during {k}" for k, v in busy.items())
                + ": those figures are not this machine's quiet figures; run again on a quiet machine",
                flush=True,
            )
        summary.update({k: round(v, 3) for k, v in ratios.items()})
        summary.update(
            {
                "target": TARGET_RATIO,
                "targetMet": met,
                "client": args.client,
                "concurrency": args.concurrency,
                "durationSeconds": args.duration,
            }
        )
        print(json.dumps(summary))
    finally:
        stop_processes(procs, STOP_TIMEOUT_S)
        stop_processes([anvil], 10)


async def main(args: argparse.Namespace) -> None:
    # SIGTERM cancels the run like Ctrl-C does, so the processes it started are stopped
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    if args.client == "auto":
        args.client = "wrk" if shutil.which("wrk") else "aiohttp"
    elif args.client == "wrk" and not shutil.which("wrk"):
        raise SystemExit("wrk is not on the PATH (apt-get install wrk), or use --client aiohttp")
    real = len(json.loads(devnet.DEFAULT_PROJECTS_FILE.read_text()))
    if args.projects < real:
        raise SystemExit(f"--projects must be at least the {real} real projects")
    kept = "logs (anvil, daemon, bare server) and the catalogue file"
    await in_scratch_database(ROOT, "relayer-catalogue-", kept, lambda state, dsn: run(args, state, dsn))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--projects", type=int, default=10_000, help="catalogue size, real ones included")
    parser.add_argument("--duration", type=int, default=10, help="measured seconds a target")
    parser.add_argument("--warmup", type=int, default=2, help="uncounted seconds before each target")
    parser.add_argument("--concurrency", type=int, default=50, help="connections (requests in flight)")
    parser.add_argument("--client", choices=("auto", "wrk", "aiohttp"), default="auto")
    parser.add_argument("--threads", type=int, default=1, help="wrk threads")
    parser.add_argument("--seed", type=int, default=1, help="of the generated projects and the mix")
    parser.add_argument("--profile", help="run relayer serve under cProfile, writing PROFILE when it stops")
    asyncio.run(main(parser.parse_args()))
