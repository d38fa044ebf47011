//! The row-level edges the changelog needs: a seat's rows past a change
//! sequence, what was published, and a carried row applied by the spec's
//! rules (a mutable row replaces, an append-only one is kept once, a
//! vector is taken only when this node holds none).

use serde_json::Value;
use sqlx::Row;

use super::*;

impl MemoryStore {
    /// The seat's rows stamped past `after`, oldest first: what a
    /// changelog cycle publishes.
    pub async fn rows_since(
        &self,
        handle: &str,
        after: i64,
    ) -> Result<Vec<CarriedRow>, sqlx::Error> {
        let mut out = Vec::new();
        // Every table from one snapshot: read one by one, a turn's row
        // committed between two reads was missed while a later row of the
        // same turn was seen, and the flush marked past both (the chaos
        // soak handed a seat over without one of its episodes). Writes
        // commit in change-sequence order (one writer at a time), so one
        // snapshot holds every row up to its highest sequence.
        let mut snapshot = self.pool.begin().await?;
        for table in Table::ALL {
            let rows = sqlx::query(&format!(
                "SELECT * FROM {} WHERE agent_handle = ? AND change_seq > ? ORDER BY change_seq",
                table.name()
            ))
            .bind(handle)
            .bind(after)
            .fetch_all(&mut *snapshot)
            .await?;
            for r in &rows {
                let row = row_json(table, r, true)?;
                out.push(CarriedRow {
                    table,
                    id: r.try_get("id")?,
                    seq: r.try_get("change_seq")?,
                    row,
                });
            }
        }
        snapshot.commit().await?;
        out.sort_by_key(|r| r.seq);
        Ok(out)
    }

    /// The node's change sequence now (it moves on every memory write).
    pub async fn change_seq(&self) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar("SELECT value FROM memory_change_seq WHERE id = 1")
            .fetch_one(&self.pool)
            .await
    }

    /// Every seat with a row stamped past what this node published of it,
    /// in one query (a changelog cycle flushes only these: a node that just
    /// took a thousand seats does not read each one's seven tables to find
    /// nothing). Hydrated rows are stamped 0 and never count.
    pub async fn seats_with_unpublished(
        &self,
    ) -> Result<std::collections::BTreeSet<String>, sqlx::Error> {
        let tops: Vec<String> = Table::ALL
            .iter()
            .map(|t| {
                format!(
                    "SELECT agent_handle AS h, MAX(change_seq) AS top FROM {} GROUP BY agent_handle",
                    t.name()
                )
            })
            .collect();
        let sql = format!(
            "SELECT x.h FROM ({}) AS x LEFT JOIN memory_published p ON p.agent_handle = x.h \
             GROUP BY x.h HAVING MAX(x.top) > COALESCE(MAX(p.last_seq), 0)",
            tops.join(" UNION ALL ")
        );
        Ok(sqlx::query_scalar(&sql)
            .fetch_all(&self.pool)
            .await?
            .into_iter()
            .collect())
    }

    /// The highest change sequence of the seat this node has published.
    pub async fn last_published(&self, handle: &str) -> Result<i64, sqlx::Error> {
        Ok(
            sqlx::query_scalar("SELECT last_seq FROM memory_published WHERE agent_handle = ?")
                .bind(handle)
                .fetch_optional(&self.pool)
                .await?
                .unwrap_or(0),
        )
    }

    /// Record that the seat's rows through `seq` are published.
    pub async fn mark_published(&self, handle: &str, seq: i64) -> Result<(), sqlx::Error> {
        sqlx::query(
            "INSERT INTO memory_published (agent_handle, last_seq) VALUES (?, ?) \
             ON CONFLICT(agent_handle) DO UPDATE SET last_seq = MAX(last_seq, excluded.last_seq)",
        )
        .bind(handle)
        .bind(seq)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Apply one row carried by the changelog (hydration), by the spec's
    /// rules. A hydrated row is stamped 0: it is already on the changelog,
    /// so this node does not publish it again.
    pub async fn apply_carried(&self, handle: &str, c: &CarriedRow) -> Result<Applied, ApplyError> {
        let mut tx = self.write().await?;
        let applied = Self::apply_one(&mut tx, handle, c, self.current_vector.as_ref()).await?;
        tx.commit().await?;
        Ok(applied)
    }

    /// Apply a seat's carried rows (a hydration), [`CARRIED_PER_WRITE`] to
    /// a write transaction rather than one each: each row's answer, in
    /// order (a row that cannot be read is its own error; the others
    /// apply). A database failure ends it: what was committed stays (every
    /// row applies idempotently, so the next hydration finishes the rest).
    pub async fn apply_carried_all(
        &self,
        handle: &str,
        rows: &[CarriedRow],
    ) -> Result<Vec<Result<Applied, ApplyError>>, sqlx::Error> {
        let mut out = Vec::with_capacity(rows.len());
        for chunk in rows.chunks(CARRIED_PER_WRITE) {
            let mut tx = self.write().await?;
            for c in chunk {
                match Self::apply_one(&mut tx, handle, c, self.current_vector.as_ref()).await {
                    Err(ApplyError::Db(e)) => return Err(e),
                    answer => out.push(answer),
                }
            }
            tx.commit().await?;
        }
        Ok(out)
    }

    /// One carried row, inside the caller's write transaction.
    async fn apply_one(
        conn: &mut sqlx::SqliteConnection,
        handle: &str,
        c: &CarriedRow,
        current_vector: Option<&VectorId>,
    ) -> Result<Applied, ApplyError> {
        let table = c.table;
        let seat = c
            .row
            .get("agent_handle")
            .and_then(Value::as_str)
            .unwrap_or("");
        if seat != handle {
            return Err(ApplyError::WrongSeat {
                expected: handle.to_string(),
                found: seat.to_string(),
            });
        }
        let existed: bool = sqlx::query_scalar::<_, i64>(&format!(
            "SELECT COUNT(*) FROM {} WHERE id = ?",
            table.name()
        ))
        .bind(&c.id)
        .fetch_one(&mut *conn)
        .await?
            > 0;
        let sql = carried_upsert_sql(table);
        let r = match bind_carried(sqlx::query(&sql), c)?
            .execute(&mut *conn)
            .await
        {
            Ok(r) => r,
            // A mutable row colliding on its natural key under another id.
            // The failed statement changed nothing, and the transaction
            // goes on (SQLite aborts the statement, not the transaction).
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() => {
                return Ok(Applied::Collided);
            }
            Err(e) => return Err(e.into()),
        };
        let applied = if table.is_mutable() {
            if existed {
                Applied::Replaced
            } else {
                Applied::Inserted
            }
        } else if r.rows_affected() == 1 {
            Applied::Inserted
        } else if !existed {
            Applied::Collided
        } else {
            Applied::KeptLocal
        };
        if applied == Applied::KeptLocal && table.has_vector() {
            return Self::take_carried_vector_row(conn, c, current_vector).await;
        }
        Ok(applied)
    }

    /// A kept-local row whose carried copy holds a vector: the carried
    /// vector replaces the local one when [`take_carried_vector`] says so
    /// (`VectorTaken`), else the local row stands whole (`KeptLocal`).
    async fn take_carried_vector_row(
        conn: &mut sqlx::SqliteConnection,
        c: &CarriedRow,
        current_vector: Option<&VectorId>,
    ) -> Result<Applied, ApplyError> {
        let table = c.table;
        let stored: StoredVector = sqlx::query_as(&format!(
            "SELECT vector_model, vector_dims, vector FROM {} WHERE id = ?",
            table.name()
        ))
        .bind(&c.id)
        .fetch_one(&mut *conn)
        .await?;
        let stored_id = match stored {
            (Some(m), Some(d), Some(_)) => Some((m, d as u32)),
            _ => None,
        };
        let carried_vec = c.row.get("vector").and_then(Value::as_str);
        let carried_id = match (
            c.row.get("vector_model").and_then(Value::as_str),
            c.row.get("vector_dims").and_then(Value::as_i64),
            carried_vec,
        ) {
            (Some(m), Some(d), Some(_)) => Some((m.to_string(), d as u32)),
            _ => None,
        };
        if !take_carried_vector(stored_id.as_ref(), carried_id.as_ref(), current_vector) {
            return Ok(Applied::KeptLocal);
        }
        let (model, dims) = carried_id.unwrap_or_default();
        let bytes =
            hex::decode(carried_vec.unwrap_or_default()).map_err(|_| ApplyError::Field {
                table: table.name(),
                column: "vector",
            })?;
        sqlx::query(&format!(
            "UPDATE {} SET vector = ?, vector_model = ?, vector_dims = ? WHERE id = ?",
            table.name()
        ))
        .bind(bytes)
        .bind(model)
        .bind(dims as i64)
        .bind(&c.id)
        .execute(&mut *conn)
        .await?;
        Ok(Applied::VectorTaken)
    }
}

/// A statement with its arguments, as sqlx builds it for SQLite.
type SqliteQuery<'q> = sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments<'q>>;

/// The statement that writes one carried row of `table`: a mutable row
/// (profile, counter) replaces the local one by id, an append-only one
/// (diary note, episode) is inserted unless its id is already here.
fn carried_upsert_sql(table: Table) -> String {
    let names: Vec<&str> = table.columns().iter().map(|(n, _)| *n).collect();
    let placeholders = vec!["?"; names.len() + 1].join(", ");
    let conflict = if table.is_mutable() {
        let sets: Vec<String> = names
            .iter()
            .filter(|n| **n != "id")
            .map(|n| format!("{n} = excluded.{n}"))
            .collect();
        format!(
            "ON CONFLICT(id) DO UPDATE SET {}, change_seq = 0",
            sets.join(", ")
        )
    } else {
        "ON CONFLICT DO NOTHING".to_string()
    };
    format!(
        "INSERT INTO {} ({}, change_seq) VALUES ({}) {}",
        table.name(),
        names.join(", "),
        placeholders,
        conflict
    )
}

/// A carried row's values bound to [`carried_upsert_sql`]'s statement, in
/// its columns' order, then `change_seq` 0; a value of the wrong type is
/// refused naming its column.
fn bind_carried<'q>(mut q: SqliteQuery<'q>, c: &CarriedRow) -> Result<SqliteQuery<'q>, ApplyError> {
    let table = c.table;
    for (name, col) in table.columns() {
        let v = c.row.get(*name).unwrap_or(&Value::Null);
        let bad = || ApplyError::Field {
            table: table.name(),
            column: name,
        };
        q = match col {
            Col::Text => q.bind(v.as_str().ok_or_else(bad)?.to_string()),
            Col::OptText => q.bind(v.as_str().map(str::to_string)),
            Col::Int => q.bind(v.as_i64().ok_or_else(bad)?),
            Col::OptInt => q.bind(v.as_i64()),
            Col::OptBlob => q.bind(match v.as_str() {
                Some(h) => Some(hex::decode(h).map_err(|_| bad())?),
                None => None,
            }),
        };
    }
    Ok(q.bind(0i64))
}
