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
