//! The people who may sign in, as the dashboard's People page manages
//! them: the company file's (read-only here) and the database's — added
//! with a random password to be changed at first sign-in, removed, given
//! a role, reset, and a person's own password change (through the same
//! limiter and check bound as a sign-in). Removing or resetting a person
//! ends every stream of theirs.

use super::*;

impl Auth {
    /// Everybody who may sign in.
    pub async fn people(&self) -> Result<Vec<PersonView>, AuthError> {
        let mut out: Vec<PersonView> = self
            .users
            .iter()
            .map(|u| PersonView {
                name: u.name.clone(),
                role: u.role,
                source: "file".into(),
                must_change_password: false,
            })
            .collect();
        let rows: Vec<(String, String, i64)> =
            sqlx::query_as("SELECT name, role, must_change_password FROM people ORDER BY name")
                .fetch_all(&self.pool)
                .await?;
        for (name, role, must) in rows {
            if let Some(role) = PersonRole::parse(&role)
                && !out.iter().any(|p| p.name == name)
            {
                out.push(PersonView {
                    name,
                    role,
                    source: "database".into(),
                    must_change_password: must != 0,
                });
            }
        }
        Ok(out)
    }

    /// Whether `name` is taken (file or database).
    pub async fn exists(&self, name: &str) -> Result<bool, AuthError> {
        Ok(self.lookup(name).await?.is_some())
    }

    /// Whether `name` is defined in the company file (and so cannot be
    /// changed on the dashboard).
    pub fn in_file(&self, name: &str) -> bool {
        self.users.iter().any(|u| u.name == name)
    }

    /// Add a person to the database with a fresh random password, to be
    /// changed at their first sign-in.
    pub async fn add(&self, name: &str, role: PersonRole, by: &str) -> Result<String, AuthError> {
        let password = random_password();
        let hash = hash_blocking(password.clone()).await?;
        sqlx::query(
            "INSERT INTO people (name, password_hash, role, created_at, created_by, must_change_password) VALUES (?, ?, ?, ?, ?, 1)",
        )
        .bind(name)
        .bind(hash)
        .bind(role.as_str())
        .bind(crate::clock::now_rfc3339())
        .bind(by)
        .execute(&self.pool)
        .await?;
        Ok(password)
    }

    /// Remove a database person; every stream of theirs ends. `false` when
    /// there was nobody of that name in the database.
    pub async fn remove(&self, name: &str) -> Result<bool, AuthError> {
        let done = sqlx::query("DELETE FROM people WHERE name = ?")
            .bind(name)
            .execute(&self.pool)
            .await?
            .rows_affected()
            > 0;
        if done {
            let _ = self.ends.send(SessionEnd::Person(name.to_string()));
        }
        Ok(done)
    }

    /// Change a database person's role (read again on their next request).
    pub async fn set_role(&self, name: &str, role: PersonRole) -> Result<bool, AuthError> {
        Ok(sqlx::query("UPDATE people SET role = ? WHERE name = ?")
            .bind(role.as_str())
            .bind(name)
            .execute(&self.pool)
            .await?
            .rows_affected()
            > 0)
    }

    /// Give a database person a fresh random password, to be changed at
    /// their next sign-in; every stream of theirs ends. `None` when there
    /// is nobody of that name in the database.
    pub async fn reset_password(&self, name: &str) -> Result<Option<String>, AuthError> {
        let password = random_password();
        let hash = hash_blocking(password.clone()).await?;
        let done = sqlx::query(
            "UPDATE people SET password_hash = ?, must_change_password = 1 WHERE name = ?",
        )
        .bind(hash)
        .bind(name)
        .execute(&self.pool)
        .await?
        .rows_affected()
            > 0;
        if !done {
            return Ok(None);
        }
        let _ = self.ends.send(SessionEnd::Person(name.to_string()));
        Ok(Some(password))
    }

    /// A database person changes their own password, proving the current
    /// one (through the same limiter and check bound as a sign-in).
    pub async fn change_password(
        &self,
        client: IpAddr,
        name: &str,
        current: &str,
        new: &str,
    ) -> Result<PasswordChange, AuthError> {
        if self.in_file(name) {
            return Ok(PasswordChange::InFile);
        }
        let n = new.chars().count();
        if !(MIN_PASSWORD_CHARS..=MAX_PASSWORD_CHARS).contains(&n) {
            return Ok(PasswordChange::Weak);
        }
        if new == current {
            return Ok(PasswordChange::Unchanged);
        }
        match self.sign_in(client, name, current).await? {
            SignIn::Ok(_) => {}
            SignIn::Refused => return Ok(PasswordChange::WrongPassword),
            SignIn::Limited { retry_after, .. } => {
                return Ok(PasswordChange::Limited(retry_after));
            }
            SignIn::Busy => return Ok(PasswordChange::Limited(Duration::from_secs(1))),
        }
        let hash = hash_blocking(new.to_string()).await?;
        sqlx::query("UPDATE people SET password_hash = ?, must_change_password = 0 WHERE name = ?")
            .bind(hash)
            .bind(name)
            .execute(&self.pool)
            .await?;
        Ok(PasswordChange::Changed)
    }
}
