-- A third role, `admin` (applies a company and manages people), and a mark
-- on a person whose password must be changed at the next sign-in (the
-- first-start password, a password an admin reset). SQLite cannot change a
-- CHECK constraint in place, so the table is copied.

CREATE TABLE people_next (
    name                 TEXT PRIMARY KEY NOT NULL,
    password_hash        TEXT NOT NULL,
    role                 TEXT NOT NULL CHECK (role IN ('viewer', 'operator', 'admin')),
    created_at           TEXT NOT NULL,
    created_by           TEXT NOT NULL,
    must_change_password INTEGER NOT NULL DEFAULT 0
);

INSERT INTO people_next (name, password_hash, role, created_at, created_by)
    SELECT name, password_hash, role, created_at, created_by FROM people;

-- The person a node created at its first start could apply companies
-- before admins existed: it stays able to.
UPDATE people_next SET role = 'admin' WHERE created_by = 'first start';

DROP TABLE people;
ALTER TABLE people_next RENAME TO people;
