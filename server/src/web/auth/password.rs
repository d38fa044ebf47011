//! Password hashing for the sign-in gate: argon2id PHC strings made and
//! checked off the async threads, generated passwords, and the allocator
//! setting that gives a check's memory back.

use argon2::Argon2;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use rand::Rng;

use super::AuthError;

/// A 20-character random password from an unambiguous alphabet.
pub fn random_password() -> String {
    const ALPHABET: &[u8] = b"abcdefghjkmnpqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789";
    let mut rng = rand::thread_rng();
    (0..20)
        .map(|_| ALPHABET[rng.gen_range(0..ALPHABET.len())] as char)
        .collect()
}

/// Make the memory of a password check go back to the system when the
/// check ends. Each argon2 check allocates one 19 MiB block; glibc's
/// allocator raises its mmap threshold after the first such block is
/// freed, and from then on serves them from arenas it keeps: a burst of
/// sign-ins left the node hundreds of megabytes larger for good. A fixed
/// threshold (1 MiB) keeps every such block mapped on its own and unmapped
/// when freed. Once per process; nothing on other platforms.
pub fn return_password_memory() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: mallopt only changes the allocator's tuning; it is safe
        // to call at any time, from any thread.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
        }
    });
}

/// An argon2id PHC string for `password`.
pub fn hash_password(password: &str) -> Result<String, AuthError> {
    let salt = SaltString::generate(&mut argon2::password_hash::rand_core::OsRng);
    Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|e| AuthError::Hash(e.to_string()))
}

pub(super) async fn hash_blocking(password: String) -> Result<String, AuthError> {
    tokio::task::spawn_blocking(move || hash_password(&password))
        .await
        .map_err(|e| AuthError::Hash(e.to_string()))?
}

pub(super) async fn verify_blocking(hash: String, password: String) -> bool {
    tokio::task::spawn_blocking(move || {
        PasswordHash::new(&hash)
            .map(|h| {
                Argon2::default()
                    .verify_password(password.as_bytes(), &h)
                    .is_ok()
            })
            .unwrap_or(false)
    })
    .await
    .unwrap_or(false)
}
