-- The rest of a seat's memory, vectors on notes and episodes, and what
-- this node last published of each seat to the changelog.

ALTER TABLE agent_diary ADD COLUMN vector BLOB;
ALTER TABLE agent_diary ADD COLUMN vector_model TEXT;
ALTER TABLE agent_diary ADD COLUMN vector_dims INTEGER;
ALTER TABLE episodes ADD COLUMN vector BLOB;
ALTER TABLE episodes ADD COLUMN vector_model TEXT;
ALTER TABLE episodes ADD COLUMN vector_dims INTEGER;
CREATE INDEX agent_diary_expiry ON agent_diary (expires_at);

-- Small mutable rows: the carried copy wins on hydration.
CREATE TABLE counterparty_profiles (
    id                TEXT PRIMARY KEY NOT NULL,
    agent_handle      TEXT NOT NULL,
    counterparty      TEXT NOT NULL,
    interaction_count INTEGER NOT NULL DEFAULT 0,
    -- The work key last counted: a repeat of it is not counted again.
    last_work_key     TEXT,
    updated_at        TEXT NOT NULL,
    change_seq        INTEGER NOT NULL
);
CREATE UNIQUE INDEX counterparty_profiles_key ON counterparty_profiles (agent_handle, counterparty);
CREATE INDEX counterparty_profiles_seq ON counterparty_profiles (agent_handle, change_seq);

CREATE TABLE skills (
    id           TEXT PRIMARY KEY NOT NULL,
    agent_handle TEXT NOT NULL,
    name         TEXT NOT NULL,
    state        TEXT NOT NULL,
    use_count    INTEGER NOT NULL DEFAULT 0,
    updated_at   TEXT NOT NULL,
    change_seq   INTEGER NOT NULL
);
CREATE UNIQUE INDEX skills_key ON skills (agent_handle, name);
CREATE INDEX skills_seq ON skills (agent_handle, change_seq);

-- Append-only: a version, once written, never changes.
CREATE TABLE skill_versions (
    id           TEXT PRIMARY KEY NOT NULL,
    agent_handle TEXT NOT NULL,
    skill_name   TEXT NOT NULL,
    version      INTEGER NOT NULL,
    body         TEXT NOT NULL,
    created_at   TEXT NOT NULL,
    change_seq   INTEGER NOT NULL
);
CREATE UNIQUE INDEX skill_versions_key ON skill_versions (agent_handle, skill_name, version);
CREATE INDEX skill_versions_seq ON skill_versions (agent_handle, change_seq);

CREATE TABLE agent_onboarding_markers (
    id           TEXT PRIMARY KEY NOT NULL,
    agent_handle TEXT NOT NULL,
    marker       TEXT NOT NULL,
    value        TEXT NOT NULL,
    updated_at   TEXT NOT NULL,
    change_seq   INTEGER NOT NULL
);
CREATE UNIQUE INDEX agent_onboarding_markers_key ON agent_onboarding_markers (agent_handle, marker);
CREATE INDEX agent_onboarding_markers_seq ON agent_onboarding_markers (agent_handle, change_seq);

-- The conversation ledger: what the seat saw and said, per thread.
CREATE TABLE conversations (
    id           TEXT PRIMARY KEY NOT NULL,
    agent_handle TEXT NOT NULL,
    thread       TEXT NOT NULL,
    message_id   TEXT,
    author       TEXT NOT NULL,
    text         TEXT NOT NULL,
    at           TEXT NOT NULL,
    change_seq   INTEGER NOT NULL
);
CREATE UNIQUE INDEX conversations_message ON conversations (agent_handle, message_id);
CREATE INDEX conversations_seq ON conversations (agent_handle, change_seq);
CREATE INDEX conversations_thread ON conversations (agent_handle, thread, at);

-- The highest change sequence this node has published of each seat.
CREATE TABLE memory_published (
    agent_handle TEXT PRIMARY KEY NOT NULL,
    last_seq     INTEGER NOT NULL
);
