"""Prometheus metrics on a dedicated registry. Labels only from bounded sets (action, error
code, state, stage), never addresses or hashes."""

from __future__ import annotations

from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from relayer.domain.states import JobState

STAGES: Final = ("accepted_to_submitted", "submitted_to_mined", "mined_to_indexed")
STAGE_BUCKETS: Final = (0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120, 300)


class Metrics:
    """All metrics of one daemon process."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._relay()
        self._http()
        self._workers()
        self._executor()
        self._backlog()
        self._solvency()
        self._incidents()

    def _relay(self) -> None:
        """Relay jobs: by state, their transitions and the time per stage."""
        self.jobs_by_state = Gauge(
            "relayer_relay_jobs", "Relay jobs by state (from Postgres).", ["state"], registry=self.registry
        )
        for state in JobState:
            self.jobs_by_state.labels(state.value)
        self.job_transitions = Counter(
            "relayer_relay_job_transitions_total",
            "Relay job state changes made here.",
            ["state"],
            registry=self.registry,
        )
        self.stage_seconds = Histogram(
            "relayer_relay_stage_duration_seconds",
            "Time a relay job spent per stage (accepted->submitted, submitted->mined, mined->indexed).",
            ["stage"],
            buckets=STAGE_BUCKETS,
            registry=self.registry,
        )
        for stage in STAGES:
            self.stage_seconds.labels(stage)

    def _http(self) -> None:
        """HTTP requests by action and code, error responses by spec code, durations."""
        self.requests = Counter(
            "relayer_http_requests_total",
            "HTTP requests by action and outcome code.",
            ["action", "code"],
            registry=self.registry,
        )
        self.error_responses = Counter(
            "relayer_http_error_responses_total",
            "HTTP error responses by spec error code.",
            ["code"],
            registry=self.registry,
        )
        self.connections_refused = Counter(
            "relayer_http_connections_refused_total",
            "Client connections answered 503 and closed at once: the process held its connection cap.",
            registry=self.registry,
        )
        self.connections_evicted = Counter(
            "relayer_http_connections_evicted_total",
            "Client connections closed at the connection cap to make room: the oldest that had "
            "not sent a request (an idle or slow-head flood).",
            registry=self.registry,
        )
        self.unhandled_errors = Counter(
            "relayer_http_unhandled_errors_total",
            "Requests that failed on an unexpected exception (answered 500 internal_error): a bug.",
            registry=self.registry,
        )
        self.request_seconds = Histogram(
            "relayer_http_request_duration_seconds",
            "HTTP request duration by action.",
            ["action"],
            registry=self.registry,
        )
        self.server_requests = Counter(
            "relayer_http_server_requests_total",
            "HTTP requests by route template, method and status (every route, both APIs).",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.server_seconds = Histogram(
            "relayer_http_server_request_duration_seconds",
            "HTTP request duration by route template and method.",
            ["route", "method"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=self.registry,
        )
        self.challenges = Counter(
            "relayer_x402_challenges_total",
            "402 payment_required challenges issued (actions/retire without an authorization).",
            registry=self.registry,
        )
        self.authorizations = Counter(
            "relayer_authorizations_total",
            "Signed authorizations posted to actions/retire: accepted, or refused by spec code.",
            ["outcome", "reason"],
            registry=self.registry,
        )
        self.rate_limited = Counter(
            "relayer_rate_limited_total",
            "Requests refused by the per-client rate limit.",
            registry=self.registry,
        )
        self.db_pool = Gauge(
            "relayer_db_pool_connections",
            "Database pool connections: in_use, idle and max.",
            ["state"],
            registry=self.registry,
        )

    def _workers(self) -> None:
        """Worker health: RPC failures, restarts, the indexer's block."""
        self.rpc_errors = Counter(
            "relayer_rpc_errors_total",
            "Chain RPC failures seen by workers.",
            ["worker"],
            registry=self.registry,
        )
        self.worker_restarts = Counter(
            "relayer_worker_restarts_total",
            "Workers restarted after dying.",
            ["worker"],
            registry=self.registry,
        )
        self.indexed_block = Gauge(
            "relayer_indexer_block",
            "Last block the retirement indexer (the chain follower) has processed, per relayed chain.",
            ["chain_id"],
            registry=self.registry,
        )
        self.catalogue_block = Gauge(
            "relayer_catalogue_indexer_block",
            "Last block the marketplace catalogue indexer has processed, per indexed chain.",
            ["chain_id"],
            registry=self.registry,
        )
        self.block_time_measured = Gauge(
            "relayer_chain_block_time_measured_seconds",
            "The chain's block interval measured from its newest 64 headers at start (0: not measured).",
            ["chain_id"],
            registry=self.registry,
        )
        self.follower_lag = Gauge(
            "relayer_follower_lag_blocks",
            "Blocks between the chain's head and the last block the follower read, at its last step.",
            ["chain_id"],
            registry=self.registry,
        )
        self.follower_blocks = Counter(
            "relayer_follower_blocks_total",
            "Blocks the follower moved past (our receipts recorded); CPU per block = "
            "relayer_follower_cpu_seconds_total / this.",
            ["chain_id"],
            registry=self.registry,
        )
        self.follower_cpu_seconds = Counter(
            "relayer_follower_cpu_seconds_total",
            "Thread CPU time during the follower's steps, seconds (it includes what other tasks "
            "of the process ran while a step awaited the node or the database).",
            ["chain_id"],
            registry=self.registry,
        )

    def _executor(self) -> None:
        """The executor lanes: broadcasts, replacements, no-ops, reorgs."""
        self.broadcasts = Counter(
            "relayer_broadcasts_total",
            "Raw transactions sent, by the node's answer (sent, known, nonce_used, nonce_ahead, "
            "underpriced, fee_below_base, no_funds).",
            ["result"],
            registry=self.registry,
        )
        self.replacements = Counter(
            "relayer_replacements_total",
            "Same-nonce replacements with bumped fees, by kind (relay, noop).",
            ["kind"],
            registry=self.registry,
        )
        self.noops = Counter(
            "relayer_noops_total",
            "No-ops signed to fill a nonce, by reason (hole, expired).",
            ["reason"],
            registry=self.registry,
        )
        self.foreign_nonces = Counter(
            "relayer_foreign_nonces_total",
            "Executor nonces the lane journaled that a transaction not in the journal took (the "
            "executor key used elsewhere); each job waiting at one is signed again or ended.",
            registry=self.registry,
        )
        self.reorgs = Counter(
            "relayer_reorgs_total",
            "Reorgs the follower or a catalogue indexer undid (back to the common ancestor), per chain.",
            ["chain_id"],
            registry=self.registry,
        )

    def _backlog(self) -> None:
        """What is waiting: each lane's unmined nonces, each indexer's lag, the oldest job
        in each open state."""
        self.nonce_lag = Gauge(
            "relayer_executor_nonce_lag",
            "Nonces of a key signed and sent but not yet mined (its lane's backlog).",
            ["key"],
            registry=self.registry,
        )
        self.indexer_lag = Gauge(
            "relayer_indexer_lag_blocks",
            "Chain head minus the last indexed block, by chain and indexer (retirements, catalogue).",
            ["chain_id", "indexer"],
            registry=self.registry,
        )
        self.oldest_job_age = Gauge(
            "relayer_relay_oldest_job_age_seconds",
            "Age of the oldest open relay job in each state (since its last change; open: not final "
            "for its kind, so a confirmed transfer is not), seconds.",
            ["state"],
            registry=self.registry,
        )

    def _solvency(self) -> None:
        """The executor keys' money: balances, what they cover, drained keys, and the
        solvency ledger (wei paid, allowances received)."""
        self.executor_balance_wei = Gauge(
            "relayer_executor_balance_wei",
            "Executor ETH balance, wei, by key (its position in the configured keys).",
            ["key"],
            registry=self.registry,
        )
        self.executor_covered = Gauge(
            "relayer_executor_covered_retirements",
            "How many more class retirements the key's balance pays gas for at the current gas "
            "price (balance / (class gas budget x gas price)).",
            ["key"],
            registry=self.registry,
        )
        self.executor_drained = Gauge(
            "relayer_executor_drained",
            "1 while a key's balance is below the floor and its lane takes no new work.",
            ["key"],
            registry=self.registry,
        )
        self.gas_paid_wei = Counter(
            "relayer_executor_gas_paid_wei_total",
            "What mined executor transactions cost (gas used times effective gas price plus the "
            "L1 data fee), wei, by kind (relay, noop) and outcome (success, reverted).",
            ["kind", "outcome"],
            registry=self.registry,
        )
        self.allowance_received_wei = Counter(
            "relayer_executor_allowance_received_wei_total",
            "What the gas allowances of successful relays were worth when priced, wei.",
            registry=self.registry,
        )
        self.noop_cost_wei = Counter(
            "relayer_executor_noop_cost_wei_total",
            "What mined no-ops cost the executor (gas used times effective gas price), wei.",
            registry=self.registry,
        )

    def _incidents(self) -> None:
        """Incidents that halt work (:mod:`relayer.domain.incidents`): the chain identity,
        deep reorgs, nonce gaps, and the worker steps they halted."""
        self.chain_identity_mismatch = Gauge(
            "relayer_chain_identity_mismatch",
            "1 while the chain node answers another chain id or genesis block than the one the "
            "database belongs to (the follower, indexers and lanes of that chain halt).",
            ["chain_id"],
            registry=self.registry,
        )
        self.deep_reorg = Gauge(
            "relayer_deep_reorg",
            "1 while a worker halts on a reorg deeper than the confirmation window, below the "
            "finalized block or past its memory (nothing is rewound), by chain and worker "
            "(follower, catalogue).",
            ["chain_id", "worker"],
            registry=self.registry,
        )
        self.nonce_gap = Gauge(
            "relayer_executor_nonce_gap",
            "1 while a key's lane halts on a nonce gap larger than its in-flight window (no "
            "no-ops are signed), by key.",
            ["key"],
            registry=self.registry,
        )
        self.halted_steps = Counter(
            "relayer_halted_steps_total",
            "Worker steps halted by an incident, by worker (follower, catalogue, broadcaster) and "
            "kind (chain_identity, deep_reorg, nonce_gap).",
            ["worker", "kind"],
            registry=self.registry,
        )

    def observe_stage(self, stage: str, start: float | None, end: float | None) -> None:
        if start is not None and end is not None and end >= start:
            self.stage_seconds.labels(stage).observe(end - start)
