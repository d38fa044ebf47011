//! What the dashboard and the agents' tools read of a seat's memory here:
//! a conversation thread, the newest diary notes and episodes, every
//! table's newest rows for the seat's memory page, and the vector a note
//! or an episode holds.

use serde_json::{Map, Value};

use super::*;

impl MemoryStore {
    /// The newest `limit` entries of one of the seat's conversation
    /// threads, oldest first: (author, text, at).
    pub async fn thread(
        &self,
        handle: &str,
        thread: &str,
        limit: u32,
    ) -> Result<Vec<(String, String, String)>, sqlx::Error> {
        let mut rows: Vec<(String, String, String)> = sqlx::query_as(
            "SELECT author, text, at FROM conversations \
             WHERE agent_handle = ? AND thread = ? ORDER BY at DESC, rowid DESC LIMIT ?",
        )
        .bind(handle)
        .bind(thread)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.reverse();
        Ok(rows)
    }

    /// The seat's newest diary notes, newest first.
    pub async fn diary(&self, handle: &str, limit: u32) -> Result<Vec<DiaryNote>, sqlx::Error> {
        let rows: Vec<(String, String, Option<String>, String, i64)> = sqlx::query_as(
            "SELECT id, content, work_key, created_at, change_seq FROM agent_diary \
             WHERE agent_handle = ? ORDER BY created_at DESC, rowid DESC LIMIT ?",
        )
        .bind(handle)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(
                |(id, content, work_key, created_at, change_seq)| DiaryNote {
                    id,
                    content,
                    work_key,
                    created_at,
                    change_seq,
                },
            )
            .collect())
    }

    /// The seat's newest episodes, newest first.
    pub async fn episodes(&self, handle: &str, limit: u32) -> Result<Vec<Episode>, sqlx::Error> {
        let rows: Vec<(String, Option<String>, String, String, String, i64)> = sqlx::query_as(
            "SELECT id, work_key, summary, turn_id, created_at, change_seq FROM episodes \
             WHERE agent_handle = ? ORDER BY created_at DESC, rowid DESC LIMIT ?",
        )
        .bind(handle)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(
                |(id, work_key, summary, turn_id, created_at, change_seq)| Episode {
                    id,
                    work_key,
                    summary,
                    turn_id,
                    created_at,
                    change_seq,
                },
            )
            .collect())
    }

    async fn table_rows(
        &self,
        table: Table,
        handle: &str,
        limit: u32,
    ) -> Result<Vec<Map<String, Value>>, sqlx::Error> {
        let rows = sqlx::query(&format!(
            "SELECT * FROM {} WHERE agent_handle = ? ORDER BY rowid DESC LIMIT ?",
            table.name()
        ))
        .bind(handle)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|r| row_json(table, r, false)).collect()
    }

    /// Everything the seat remembers here (the newest `limit` rows of each
    /// table), for a screen.
    pub async fn seat_memory(&self, handle: &str, limit: u32) -> Result<SeatMemory, sqlx::Error> {
        Ok(SeatMemory {
            diary: self.table_rows(Table::AgentDiary, handle, limit).await?,
            episodes: self.table_rows(Table::Episodes, handle, limit).await?,
            counterparty_profiles: self
                .table_rows(Table::CounterpartyProfiles, handle, limit)
                .await?,
            skills: self.table_rows(Table::Skills, handle, limit).await?,
            skill_versions: self.table_rows(Table::SkillVersions, handle, limit).await?,
            onboarding_markers: self
                .table_rows(Table::AgentOnboardingMarkers, handle, limit)
                .await?,
            conversations: self.table_rows(Table::Conversations, handle, limit).await?,
        })
    }

    /// The vector a diary note or episode holds here: (model, dims, bytes).
    pub async fn vector_of(
        &self,
        table: Table,
        id: &str,
    ) -> Result<Option<(String, u32, Vec<u8>)>, sqlx::Error> {
        let row: Option<StoredVector> = sqlx::query_as(&format!(
            "SELECT vector_model, vector_dims, vector FROM {} WHERE id = ?",
            table.name()
        ))
        .bind(id)
        .fetch_optional(&self.pool)
        .await?;
        Ok(match row {
            Some((Some(m), Some(d), Some(v))) => Some((m, d as u32, v)),
            _ => None,
        })
    }
}
