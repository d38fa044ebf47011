//! The node's database at boot: a fresh file is migrated, an already
//! migrated one is left as it is, and a failing migration stops start-up
//! having changed nothing.

use std::path::Path;

use crewlet::db::{self, DbError, MIGRATOR};
use sqlx::migrate::Migrator;

async fn tables(pool: &sqlx::SqlitePool) -> Vec<String> {
    sqlx::query_scalar("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        .fetch_all(pool)
        .await
        .unwrap()
}

async fn applied(pool: &sqlx::SqlitePool) -> Vec<i64> {
    sqlx::query_scalar("SELECT version FROM _sqlx_migrations ORDER BY version")
        .fetch_all(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_fresh_database_gets_every_migration() {
    let dir = tempfile::tempdir().unwrap();
    let pool = db::open(&dir.path().join("data"), &MIGRATOR).await.unwrap();
    let t = tables(&pool).await;
    assert!(t.contains(&"people".to_string()), "{t:?}");
    assert!(t.contains(&"audit".to_string()), "{t:?}");
    assert_eq!(applied(&pool).await.len(), MIGRATOR.iter().count());
}

#[tokio::test]
async fn an_already_migrated_database_opens_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let pool = db::open(&data, &MIGRATOR).await.unwrap();
    sqlx::query("INSERT INTO audit (at, person, action, result) VALUES ('t', 'p', 'a', 'ok')")
        .execute(&pool)
        .await
        .unwrap();
    let before = applied(&pool).await;
    pool.close().await;

    let pool = db::open(&data, &MIGRATOR).await.unwrap();
    assert_eq!(applied(&pool).await, before);
    let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM audit")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(rows, 1, "reopening keeps the data");
}

fn write(dir: &Path, name: &str, sql: &str) {
    std::fs::write(dir.join(name), sql).unwrap();
}

#[tokio::test]
async fn a_failing_migration_stops_start_up_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let migrations = dir.path().join("migrations");
    std::fs::create_dir_all(&migrations).unwrap();
    write(
        &migrations,
        "1_first.sql",
        "CREATE TABLE first (x INTEGER);",
    );
    let good = Migrator::new(migrations.as_path()).await.unwrap();
    let pool = db::open(&data, &good).await.unwrap();
    sqlx::query("INSERT INTO first (x) VALUES (7)")
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;

    // The second migration creates a table, then fails.
    write(
        &migrations,
        "2_broken.sql",
        "CREATE TABLE second (y INTEGER);\nINSERT INTO no_such_table VALUES (1);",
    );
    let broken = Migrator::new(migrations.as_path()).await.unwrap();
    let err = db::open(&data, &broken).await.unwrap_err();
    assert!(matches!(err, DbError::Migrate { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("crewlet.db") && msg.contains("nothing was changed"),
        "{msg}"
    );

    let pool = db::open_file(&data.join(db::DB_FILE)).await.unwrap();
    let t = tables(&pool).await;
    assert!(
        !t.contains(&"second".to_string()),
        "the failed migration left {t:?}"
    );
    assert_eq!(applied(&pool).await, vec![1]);
    let x: i64 = sqlx::query_scalar("SELECT x FROM first")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(x, 7);
}

#[tokio::test]
async fn an_unwritable_data_dir_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, "x").unwrap();
    let err = db::open(&file.join("data"), &MIGRATOR).await.unwrap_err();
    assert!(matches!(err, DbError::DataDir { .. }), "{err}");
    assert!(err.to_string().contains("node.data_dir"), "{err}");
}
