"""The SQLite schema, as an ordered list of migrations.

``PRAGMA user_version`` holds how many migrations a database file has had. A migration is
applied in one transaction together with the bump of ``user_version``, so a crash leaves the
file either before or after it. Append new migrations; never edit a released one.
"""

from __future__ import annotations

MIGRATIONS: tuple[str, ...] = (
    # 1: the initial schema.
    """
    CREATE TABLE tokens (
        id TEXT PRIMARY KEY,
        hash TEXT NOT NULL UNIQUE,
        role TEXT NOT NULL CHECK (role IN ('user', 'daemon')),
        namespace TEXT,
        name TEXT,
        created_at REAL NOT NULL
    );
    CREATE TABLE providers (
        namespace TEXT NOT NULL,
        name TEXT NOT NULL,
        body TEXT NOT NULL,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        PRIMARY KEY (namespace, name)
    );
    CREATE TABLE modes (
        namespace TEXT NOT NULL,
        name TEXT NOT NULL,
        provider TEXT,
        body TEXT NOT NULL,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        PRIMARY KEY (namespace, name)
    );
    CREATE TABLE instances (
        instance_id TEXT PRIMARY KEY,
        namespace TEXT NOT NULL,
        provider TEXT NOT NULL,
        kube_namespace TEXT NOT NULL,
        state TEXT NOT NULL,
        reason TEXT,
        message TEXT NOT NULL DEFAULT '',
        node TEXT,
        launched_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        version INTEGER NOT NULL,
        requester TEXT NOT NULL,
        stop_requested_at REAL
    );
    CREATE INDEX instances_by_provider ON instances (namespace, provider, launched_at);
    CREATE INDEX instances_by_node ON instances (node, state);
    CREATE TABLE instance_events (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        instance_id TEXT NOT NULL REFERENCES instances (instance_id),
        state TEXT NOT NULL,
        reason TEXT,
        message TEXT NOT NULL DEFAULT '',
        at REAL NOT NULL
    );
    CREATE INDEX instance_events_by_instance ON instance_events (instance_id, id);
    CREATE TABLE tasks (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        task_id TEXT NOT NULL UNIQUE,
        kind TEXT NOT NULL CHECK (kind IN ('launch', 'stop', 'probe')),
        status TEXT NOT NULL
            CHECK (status IN ('pending', 'leased', 'done', 'failed', 'cancelled')),
        namespace TEXT NOT NULL,
        kube_namespace TEXT NOT NULL,
        provider TEXT NOT NULL,
        instance_id TEXT,
        spec TEXT,
        requester TEXT NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        lease_owner TEXT,
        lease_expires REAL,
        not_before REAL NOT NULL DEFAULT 0,
        after_task TEXT REFERENCES tasks (task_id),
        grace_period INTEGER,
        result TEXT,
        error TEXT,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        finished_at REAL
    );
    CREATE INDEX tasks_open ON tasks (status, seq);
    CREATE INDEX tasks_by_instance ON tasks (instance_id, kind);
    CREATE TABLE idempotency_keys (
        namespace TEXT NOT NULL,
        provider TEXT NOT NULL,
        key TEXT NOT NULL,
        body_sha256 TEXT NOT NULL,
        instance_id TEXT NOT NULL,
        response TEXT NOT NULL,
        created_at REAL NOT NULL,
        PRIMARY KEY (namespace, provider, key)
    );
    CREATE TABLE report_streams (
        stream TEXT PRIMARY KEY,
        last_seq INTEGER NOT NULL,
        updated_at REAL NOT NULL
    );
    CREATE TABLE instance_logs (
        instance_id TEXT PRIMARY KEY REFERENCES instances (instance_id),
        text TEXT NOT NULL,
        updated_at REAL NOT NULL
    );
    CREATE TABLE daemons (
        daemon_id TEXT PRIMARY KEY,
        node TEXT NOT NULL,
        namespaces TEXT NOT NULL,
        capacity INTEGER NOT NULL,
        last_seen REAL NOT NULL
    );
    """,
    # 2: task kind 'dockyard' (a recipe + infra the daemon renders and applies). SQLite cannot
    # alter a CHECK constraint, so the table is rebuilt: the copy references itself under its
    # new name (renamed with it), so dropping the old table breaks no foreign key; rows, seq
    # values and indexes carry over.
    """
    CREATE TABLE tasks_v2 (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        task_id TEXT NOT NULL UNIQUE,
        kind TEXT NOT NULL CHECK (kind IN ('launch', 'stop', 'probe', 'dockyard')),
        status TEXT NOT NULL
            CHECK (status IN ('pending', 'leased', 'done', 'failed', 'cancelled')),
        namespace TEXT NOT NULL,
        kube_namespace TEXT NOT NULL,
        provider TEXT NOT NULL,
        instance_id TEXT,
        spec TEXT,
        requester TEXT NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        lease_owner TEXT,
        lease_expires REAL,
        not_before REAL NOT NULL DEFAULT 0,
        after_task TEXT REFERENCES tasks_v2 (task_id),
        grace_period INTEGER,
        result TEXT,
        error TEXT,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        finished_at REAL
    );
    INSERT INTO tasks_v2 (seq, task_id, kind, status, namespace, kube_namespace, provider,
        instance_id, spec, requester, attempts, lease_owner, lease_expires, not_before,
        after_task, grace_period, result, error, created_at, updated_at, finished_at)
    SELECT seq, task_id, kind, status, namespace, kube_namespace, provider, instance_id, spec,
        requester, attempts, lease_owner, lease_expires, not_before, after_task, grace_period,
        result, error, created_at, updated_at, finished_at
    FROM tasks ORDER BY seq;
    DROP TABLE tasks;
    ALTER TABLE tasks_v2 RENAME TO tasks;
    CREATE INDEX tasks_open ON tasks (status, seq);
    CREATE INDEX tasks_by_instance ON tasks (instance_id, kind);
    """,
    # 3: direct dispatch and the secret store. A direct instance keeps its dispatch, the
    # connection it was launched with (a path or a {"$secret": NAME} ref, never content), its
    # rendered Pod (so a restart can create it if it never was) and when its Pod was reaped.
    # Secrets are encrypted by the queue (the key lives outside this file).
    """
    ALTER TABLE instances ADD COLUMN dispatch TEXT NOT NULL DEFAULT 'daemon';
    ALTER TABLE instances ADD COLUMN connection TEXT;
    ALTER TABLE instances ADD COLUMN pod TEXT;
    ALTER TABLE instances ADD COLUMN reaped_at REAL;
    CREATE TABLE secrets (
        namespace TEXT NOT NULL,
        name TEXT NOT NULL,
        ciphertext BLOB NOT NULL,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        PRIMARY KEY (namespace, name)
    );
    """,
    # 4: node-aware claims. A daemon's last node offer (labels, taints, allocatable as JSON) and,
    # for a queued launch no live daemon can take, why it waits.
    """
    ALTER TABLE daemons ADD COLUMN node_info TEXT;
    ALTER TABLE instances ADD COLUMN waiting TEXT;
    """,
    # 5: live logs and results that outlive the Pod. An instance's log is kept as chunks keyed
    # by their byte offset in the log as the job printed it (see nymph.launch.logcap), with one
    # row per log saying how much arrived, which middle range was dropped to fit the cap, the
    # follower's resume cursor and whether the log is complete. The instance record gains how
    # its container ended; result files are kept whole, per instance and path.
    """
    CREATE TABLE log_streams (
        instance_id TEXT PRIMARY KEY,
        total INTEGER NOT NULL DEFAULT 0,
        dropped_start INTEGER NOT NULL DEFAULT 0,
        dropped_end INTEGER NOT NULL DEFAULT 0,
        cursor TEXT,
        complete INTEGER NOT NULL DEFAULT 0,
        note TEXT,
        updated_at REAL NOT NULL
    );
    CREATE TABLE log_chunks (
        instance_id TEXT NOT NULL,
        start INTEGER NOT NULL,
        data BLOB NOT NULL,
        PRIMARY KEY (instance_id, start)
    ) WITHOUT ROWID;
    CREATE TABLE result_files (
        instance_id TEXT NOT NULL,
        path TEXT NOT NULL,
        size INTEGER NOT NULL,
        complete INTEGER NOT NULL DEFAULT 0,
        created_at REAL NOT NULL,
        PRIMARY KEY (instance_id, path)
    ) WITHOUT ROWID;
    CREATE TABLE result_chunks (
        instance_id TEXT NOT NULL,
        path TEXT NOT NULL,
        start INTEGER NOT NULL,
        data BLOB NOT NULL,
        PRIMARY KEY (instance_id, path, start)
    ) WITHOUT ROWID;
    ALTER TABLE instances ADD COLUMN exit_code INTEGER;
    ALTER TABLE instances ADD COLUMN termination_reason TEXT;
    ALTER TABLE instances ADD COLUMN termination_message TEXT;
    ALTER TABLE instances ADD COLUMN results_error TEXT;
    """,
    # 6: daemon sessions in the database (every replica on PostgreSQL accepts every session).
    """
    CREATE TABLE daemon_sessions (
        digest TEXT PRIMARY KEY,
        session_id TEXT NOT NULL,
        daemon_id TEXT NOT NULL,
        node TEXT NOT NULL,
        namespaces TEXT NOT NULL,
        token_id TEXT NOT NULL,
        scope TEXT,
        expires_at REAL NOT NULL
    );
    """,
    # 7: who may write an instance (see nymph.queue.sql.binding): the session, daemon id and
    # node that applied it, and whether it is a Pod pinned to that node; and the daemon whose
    # lease of a task was handed back (released, expired, requeued) until another claims it.
    # Instances applied before are bound to the daemon that completed their launch, on the node
    # they run on.
    """
    ALTER TABLE instances ADD COLUMN applied_session TEXT;
    ALTER TABLE instances ADD COLUMN applied_daemon TEXT;
    ALTER TABLE instances ADD COLUMN applied_node TEXT;
    ALTER TABLE instances ADD COLUMN applied_pinned INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE tasks ADD COLUMN last_owner TEXT;
    UPDATE instances SET applied_daemon = (
        SELECT t.lease_owner FROM tasks t
        WHERE t.instance_id = instances.instance_id AND t.kind IN ('launch', 'dockyard')
          AND t.status = 'done'
        ORDER BY t.seq DESC LIMIT 1
    );
    UPDATE instances SET applied_node = node, applied_pinned = 1
        WHERE applied_daemon IS NOT NULL AND node IS NOT NULL AND node != '';
    UPDATE instances SET applied_node = COALESCE(
        (SELECT d.node FROM daemons d WHERE d.daemon_id = instances.applied_daemon), '')
        WHERE applied_daemon IS NOT NULL AND applied_pinned = 0;
    """,
    # 8: paged lists and the expiry of old instances. Each page of a provider's instances is an
    # index range in creation order (with or without a state filter); stopped instances are
    # found by when they stopped, the idempotency keys and tasks of an expired instance by its id. What is left of an expired instance is a tombstone
    # (id, scope, when it expired), so its GET says it expired; tombstones go in their turn.
    """
    CREATE INDEX instances_page ON instances (namespace, provider, launched_at, instance_id);
    CREATE INDEX instances_page_state ON instances (namespace, provider, state, launched_at, instance_id);
    CREATE INDEX instances_by_state_age ON instances (state, updated_at);
    CREATE INDEX idempotency_by_instance ON idempotency_keys (instance_id);
    CREATE INDEX daemons_page ON daemons (node, daemon_id);
    CREATE TABLE expired_instances (
        instance_id TEXT PRIMARY KEY,
        namespace TEXT NOT NULL,
        provider TEXT NOT NULL,
        expired_at REAL NOT NULL
    );
    CREATE INDEX expired_instances_by_age ON expired_instances (expired_at);
    """,
    # 9: a queue that schedules (see nymph.queue.sql.schedule): each launch's priority and
    # group (kube namespace, namespace and the digest of its placement needs) index the claimable
    # work by group; an instance's charge (the requests it holds, from its lease or Pod until it
    # stops) counts towards its namespace's share and quota; the operators' settings per
    # namespace; and a third token role, admin.
    """
    ALTER TABLE tasks ADD COLUMN priority INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE tasks ADD COLUMN grp TEXT;
    CREATE INDEX tasks_queue ON tasks (grp, priority DESC, seq) WHERE status = 'pending';
    CREATE INDEX tasks_plain ON tasks (seq) WHERE status = 'pending' AND grp IS NULL;
    CREATE INDEX tasks_due ON tasks (not_before) WHERE status = 'pending' AND not_before > 0;
    CREATE INDEX tasks_pending_ns ON tasks (namespace, priority DESC, seq)
        WHERE status = 'pending' AND grp IS NOT NULL;
    ALTER TABLE instances ADD COLUMN charge TEXT;
    CREATE INDEX instances_charged ON instances (namespace) WHERE charge IS NOT NULL;
    CREATE TABLE quotas (
        namespace TEXT PRIMARY KEY,
        weight TEXT NOT NULL DEFAULT '1',
        max_running INTEGER,
        resources TEXT,
        max_runtime INTEGER,
        default_runtime INTEGER,
        updated_at REAL NOT NULL
    );
    CREATE TABLE tokens_v2 (
        id TEXT PRIMARY KEY,
        hash TEXT NOT NULL UNIQUE,
        role TEXT NOT NULL CHECK (role IN ('user', 'daemon', 'admin')),
        namespace TEXT,
        name TEXT,
        created_at REAL NOT NULL
    );
    INSERT INTO tokens_v2 (id, hash, role, namespace, name, created_at)
        SELECT id, hash, role, namespace, name, created_at FROM tokens;
    DROP TABLE tokens;
    ALTER TABLE tokens_v2 RENAME TO tokens;
    """,
    # 10: an index on tasks.after_task (PostgreSQL has had one since its migration 1). Deleting
    # a task makes SQLite look for the tasks that wait on it (the foreign key); without the index
    # that is a scan of every task per deleted one, which made expiring 200 instances take 1.5 s.
    """
    CREATE INDEX IF NOT EXISTS tasks_after ON tasks (after_task);
    """,
    # 11: direct launches a quota holds back (recorded, their Pod not created yet), found in
    # the order they came.
    """
    CREATE INDEX instances_held ON instances (namespace, launched_at)
        WHERE state = 'queued' AND dispatch = 'direct' AND charge IS NULL;
    """,
    # 12: how many launches each namespace was handed lately (a count that fades, see
    # nymph.queue.scheduling.decayed): the scheduler's tie-break when shares are equal.
    """
    CREATE TABLE recent_usage (
        namespace TEXT PRIMARY KEY,
        served REAL NOT NULL,
        at REAL NOT NULL
    );
    """,
    # 13: launch groups (one POST, many launches: see nymph.queue.sql.groups) and retries (a
    # new attempt of a failed launch, linked both ways: see nymph.queue.sql.retries). An
    # instance's group and place in it; its attempt (1 for a first launch), the instance it
    # retries and the one that retries it; ``retry`` holds what a next attempt needs (its
    # policy and spec, JSON), only for launches that have a retry policy.
    """
    CREATE TABLE launch_groups (
        group_id TEXT PRIMARY KEY,
        namespace TEXT NOT NULL,
        provider TEXT NOT NULL,
        total INTEGER NOT NULL,
        requester TEXT NOT NULL,
        created_at REAL NOT NULL,
        stop_requested_at REAL
    );
    ALTER TABLE instances ADD COLUMN group_id TEXT;
    ALTER TABLE instances ADD COLUMN group_index INTEGER;
    ALTER TABLE instances ADD COLUMN attempt INTEGER NOT NULL DEFAULT 1;
    ALTER TABLE instances ADD COLUMN retry_of TEXT;
    ALTER TABLE instances ADD COLUMN retried_as TEXT;
    ALTER TABLE instances ADD COLUMN retry TEXT;
    CREATE INDEX instances_by_group ON instances (group_id, group_index, attempt)
        WHERE group_id IS NOT NULL;
    """,
    # 14: the namespace event stream (see nymph.queue.sql.events): one row per change of an
    # instance (state, reason, exit code, attempt, group, node, the kind of its waiting reason),
    # written in the transaction of the change; ``seq`` is the cursor. ``event_marks`` keeps the
    # highest seq retention removed (a cursor before it is gone) and, on PostgreSQL, the counter
    # seqs come from.
    """
    CREATE TABLE events (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        namespace TEXT NOT NULL,
        provider TEXT NOT NULL,
        instance_id TEXT NOT NULL,
        launch_group TEXT,
        attempt INTEGER,
        changes TEXT NOT NULL,
        state TEXT NOT NULL,
        reason TEXT,
        message TEXT NOT NULL DEFAULT '',
        exit_code INTEGER,
        node TEXT,
        waiting TEXT,
        waiting_kind TEXT,
        at REAL NOT NULL
    );
    CREATE INDEX events_by_namespace ON events (namespace, seq);
    CREATE INDEX events_by_instance ON events (instance_id, seq);
    CREATE INDEX events_by_group ON events (launch_group, seq) WHERE launch_group IS NOT NULL;
    CREATE TABLE event_marks (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        clock INTEGER NOT NULL,
        floor INTEGER NOT NULL
    );
    INSERT INTO event_marks (id, clock, floor) VALUES (1, 0, 0);
    """,
    # 15: the kind of waiting reason the event stream last told of a queued instance, so that the
    # sweeper can tell when a reason worked out at read time (its quota, its namespace's share)
    # starts or stops applying (see nymph.queue.sql.placement.update_waiting).
    """
    ALTER TABLE instances ADD COLUMN waiting_told TEXT;
    """,
    # 16: a count of the daemon sessions removed or cut short (see nymph.queue.sessions), kept by
    # triggers whatever statement does it, so that a replica confirms the sessions it knows by
    # reading one row while none was, instead of every known session's row.
    """
    CREATE TABLE session_marks (
        id INTEGER PRIMARY KEY CHECK (id = 1),
        removed INTEGER NOT NULL
    );
    INSERT INTO session_marks (id, removed) VALUES (1, 0);
    CREATE TRIGGER daemon_sessions_removed AFTER DELETE ON daemon_sessions
    BEGIN
        UPDATE session_marks SET removed = removed + 1 WHERE id = 1;
    END;
    CREATE TRIGGER daemon_sessions_cut_short AFTER UPDATE OF expires_at ON daemon_sessions
    WHEN NEW.expires_at < OLD.expires_at
    BEGIN
        UPDATE session_marks SET removed = removed + 1 WHERE id = 1;
    END;
    """,
)
