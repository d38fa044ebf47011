-- People who may sign in besides those in the company file, and the audit
-- log of every person's action.

CREATE TABLE people (
    name          TEXT PRIMARY KEY NOT NULL,
    password_hash TEXT NOT NULL,
    role          TEXT NOT NULL CHECK (role IN ('viewer', 'operator')),
    created_at    TEXT NOT NULL,
    created_by    TEXT NOT NULL
);

CREATE TABLE audit (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    at      TEXT NOT NULL,
    person  TEXT NOT NULL,
    action  TEXT NOT NULL,
    seat    TEXT,
    reason  TEXT,
    result  TEXT NOT NULL
);

CREATE INDEX audit_at ON audit (at);
