-- A seat's memory on this node: the diary and the episodes a turn writes,
-- and the node's change sequence that stamps every inserted row (the
-- changelog carries rows past the last value it published; never the
-- rowid, which SQLite hands out again once the newest row is deleted).

CREATE TABLE memory_change_seq (
    id    INTEGER PRIMARY KEY CHECK (id = 1),
    value INTEGER NOT NULL
);
INSERT INTO memory_change_seq (id, value) VALUES (1, 0);

CREATE TABLE agent_diary (
    id           TEXT PRIMARY KEY NOT NULL,
    agent_handle TEXT NOT NULL,
    content      TEXT NOT NULL,
    -- sha256 of the content: byte-identical notes collapse on write.
    content_hash TEXT NOT NULL,
    work_key     TEXT,
    created_at   TEXT NOT NULL,
    expires_at   TEXT,
    change_seq   INTEGER NOT NULL
);
CREATE UNIQUE INDEX agent_diary_content ON agent_diary (agent_handle, content_hash);
CREATE INDEX agent_diary_seq ON agent_diary (agent_handle, change_seq);

CREATE TABLE episodes (
    id           TEXT PRIMARY KEY NOT NULL,
    agent_handle TEXT NOT NULL,
    -- NULL for a turn with no ledgered trigger: never deduplicated.
    work_key     TEXT,
    summary      TEXT NOT NULL,
    turn_id      TEXT NOT NULL,
    created_at   TEXT NOT NULL,
    change_seq   INTEGER NOT NULL
);
CREATE UNIQUE INDEX episodes_work ON episodes (agent_handle, work_key);
CREATE INDEX episodes_seq ON episodes (agent_handle, change_seq);
