-- The fleet's events as this node saw them (web/history.rs): what the
-- Events page and a seat's timeline read from before the page opened.
-- `id` is the event's number on this node's stream (GET /api/events);
-- the newest 100,000 are kept.

CREATE TABLE fleet_events (
    id      INTEGER PRIMARY KEY NOT NULL,
    at      TEXT NOT NULL,
    name    TEXT NOT NULL,
    node    TEXT NOT NULL,
    seat    TEXT,
    turn_id TEXT,
    data    TEXT NOT NULL
);

CREATE INDEX fleet_events_by_seat ON fleet_events (seat, id);
CREATE INDEX fleet_events_by_node ON fleet_events (node, id);
CREATE INDEX fleet_events_by_turn ON fleet_events (turn_id, id);
CREATE INDEX fleet_events_by_name ON fleet_events (name, id);
