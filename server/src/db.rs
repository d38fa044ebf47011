//! The node's own SQLite database: opening it and migrating it at boot.
//!
//! A migration that fails stops start-up and changes nothing: each one runs
//! in its own transaction, so a failure rolls back to the last migration
//! that succeeded. This module never decides anything about seats.

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use sqlx::migrate::Migrator;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};

/// The migrations in `migrations/`, embedded in the binary.
pub static MIGRATOR: Migrator = sqlx::migrate!("../migrations");

/// The file name of the node's database inside `data_dir`.
pub const DB_FILE: &str = "crewlet.db";

#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error(
        "cannot create the data directory {dir}: {source}. Check node.data_dir and its permissions."
    )]
    DataDir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot open the database {file}: {source}")]
    Open {
        file: PathBuf,
        #[source]
        source: sqlx::Error,
    },
    #[error(
        "migrating the database {file} failed; nothing was changed by the failing migration: {source}"
    )]
    Migrate {
        file: PathBuf,
        #[source]
        source: sqlx::migrate::MigrateError,
    },
    #[error("database error: {0}")]
    Query(#[from] sqlx::Error),
}

/// Open (creating if needed) `data_dir/crewlet.db` and apply `migrator`.
pub async fn open(data_dir: &Path, migrator: &Migrator) -> Result<SqlitePool, DbError> {
    let file = data_dir.join(DB_FILE);
    private(data_dir, &file).map_err(|source| DbError::DataDir {
        dir: data_dir.to_path_buf(),
        source,
    })?;
    let pool = open_file(&file).await?;
    migrator
        .run(&pool)
        .await
        .map_err(|source| DbError::Migrate {
            file: file.clone(),
            source,
        })?;
    Ok(pool)
}

/// The data directory is the node's alone (0700: its sessions, its
/// agents' memory), and so is the database (0600; SQLite gives its
/// journal files the database's mode). Made so on every start, whatever an
/// older start or a person left.
fn private(data_dir: &Path, file: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    std::fs::create_dir_all(data_dir)?;
    std::fs::set_permissions(data_dir, std::fs::Permissions::from_mode(0o700))?;
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(file)?;
    for f in [
        file.to_path_buf(),
        with_suffix(file, "-wal"),
        with_suffix(file, "-shm"),
    ] {
        if f.exists() {
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600))?;
        }
    }
    Ok(())
}

fn with_suffix(file: &Path, suffix: &str) -> PathBuf {
    let mut s = file.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// Open a database file without migrating it.
pub async fn open_file(file: &Path) -> Result<SqlitePool, DbError> {
    let opts = SqliteConnectOptions::from_str(&format!("sqlite://{}", file.display()))
        .map_err(|source| DbError::Open {
            file: file.to_path_buf(),
            source,
        })?
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(5))
        .foreign_keys(true);
    SqlitePoolOptions::new()
        .max_connections(8)
        .connect_with(opts)
        .await
        .map_err(|source| DbError::Open {
            file: file.to_path_buf(),
            source,
        })
}

/// The node's writers to its database, one at a time in arrival order.
///
/// SQLite takes one writer at a time; writers that meet a held write lock
/// wait in its busy handler, which sleeps and retries rather than queueing,
/// so under load a writer can lose the lock again and again until its busy
/// timeout ends the write with "database is locked" — while each waiter
/// also holds one of the pool's connections. Writers that share a lane wait
/// for it here instead, in order, holding no connection, and take the write
/// lock when the transaction begins (`BEGIN IMMEDIATE`), never by upgrading
/// a read. Readers never wait for it (WAL).
#[derive(Clone, Default)]
pub struct WriteLane(std::sync::Arc<tokio::sync::Mutex<()>>);

/// A write transaction begun in its lane; the lane is the next writer's
/// once it is committed or dropped (rolled back).
pub struct Write {
    tx: sqlx::Transaction<'static, sqlx::Sqlite>,
    _turn: tokio::sync::OwnedMutexGuard<()>,
}

impl WriteLane {
    /// Wait for the lane, then begin a write transaction on `pool`.
    pub async fn begin(&self, pool: &SqlitePool) -> Result<Write, sqlx::Error> {
        let turn = self.0.clone().lock_owned().await;
        let tx = pool.begin_with("BEGIN IMMEDIATE").await?;
        Ok(Write { tx, _turn: turn })
    }
}

impl Write {
    pub async fn commit(self) -> Result<(), sqlx::Error> {
        self.tx.commit().await
    }
}

impl std::ops::Deref for Write {
    type Target = sqlx::SqliteConnection;
    fn deref(&self) -> &sqlx::SqliteConnection {
        &self.tx
    }
}

impl std::ops::DerefMut for Write {
    fn deref_mut(&mut self) -> &mut sqlx::SqliteConnection {
        &mut self.tx
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The node's database with a busy timeout of `busy`: a writer that
    /// meets a held write lock for longer is told "database is locked".
    async fn database(dir: &Path, busy: Duration) -> SqlitePool {
        let file = dir.join(DB_FILE);
        let opts = SqliteConnectOptions::from_str(&format!("sqlite://{}", file.display()))
            .unwrap()
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(busy);
        let pool = SqlitePoolOptions::new()
            .max_connections(8)
            .connect_with(opts)
            .await
            .unwrap();
        MIGRATOR.run(&pool).await.unwrap();
        pool
    }

    #[tokio::test]
    async fn a_memory_write_behind_a_longer_writer_waits_its_turn_and_is_never_told_locked() {
        let dir = tempfile::tempdir().unwrap();
        let busy = Duration::from_millis(50);
        let pool = database(dir.path(), busy).await;
        let memory = crate::memory::MemoryStore::new(pool.clone());
        // A writer in the lane holds the write lock for many busy timeouts.
        let holder = memory.lane().begin(&pool).await.unwrap();
        let writers: Vec<_> = (0..12)
            .map(|i| {
                let m = memory.clone();
                tokio::spawn(
                    async move { m.diary_write("seat-a", &format!("note {i}"), None).await },
                )
            })
            .collect();
        // A reader is not held up by the lane or the lock (WAL).
        let seq_before = memory.change_seq().await.unwrap();
        // The holder's transaction lasts ten busy timeouts: the duration is
        // the scenario, no condition is waited for.
        tokio::time::sleep(busy * 10).await;
        holder.commit().await.unwrap();
        for w in writers {
            assert!(
                w.await
                    .unwrap()
                    .expect("a queued write is never refused as locked")
            );
        }
        assert_eq!(memory.change_seq().await.unwrap(), seq_before + 12);
    }
}
