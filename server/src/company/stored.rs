//! How one company revision is kept in the config bucket: whole under
//! `revision:{n}` when it fits in one value, otherwise in parts.
//!
//! A NATS server refuses a message larger than its `max_payload` (1 MiB by
//! default) and a revision is about 200 bytes a seat, so a large company
//! (10,000 seats: about 2 MB) cannot be one value. Its JSON is cut into
//! parts of at most [`PART_BYTES`] under `revision-part:{id}:{i}`, `id`
//! unique to the apply, and `revision:{n}` holds a manifest naming them
//! with the whole's length and SHA-256. The parts are written before the
//! manifest and the manifest before the activation pointer moves, so a node
//! that follows the pointer finds every part; a revision whose parts are
//! missing or do not add up is unreadable, never half-read. The parts carry
//! no revision number, so an apply that loses the race for a number keeps
//! its parts and names them from the next one.

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{Company, CompanyError, revision_key};
use crate::coord::{StateBucket, Store};

/// The largest part written: a quarter of NATS's default `max_payload`,
/// leaving room for the message's headers and a server configured lower.
pub const PART_BYTES: usize = 256 * 1024;

/// Where a revision too large for one value keeps its parts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(super) struct Parts {
    id: String,
    count: usize,
    bytes: usize,
    sha256: String,
}

/// What `revision:{n}` holds when the revision is in parts.
#[derive(Serialize, Deserialize)]
struct Manifest {
    revision: u64,
    in_parts: Parts,
}

/// The company without its number: what a revision's parts hold.
fn unnumbered(company: &Company) -> Vec<u8> {
    let body = Company {
        revision: 0,
        ..company.clone()
    };
    serde_json::to_vec(&body).unwrap_or_default()
}

pub fn part_key(id: &str, i: usize) -> String {
    format!("revision-part:{id}:{i}")
}

/// Write `company`'s parts when it is too large for one value (`None`
/// when it fits: the revision is then written whole).
pub(super) async fn write_parts(
    store: &dyn Store,
    company: &Company,
) -> Result<Option<Parts>, CompanyError> {
    let body = unnumbered(company);
    if body.len() <= PART_BYTES {
        return Ok(None);
    }
    let id = uuid::Uuid::new_v4().simple().to_string();
    let chunks: Vec<&[u8]> = body.chunks(PART_BYTES).collect();
    for (i, chunk) in chunks.iter().enumerate() {
        store
            .create(
                StateBucket::Config,
                &part_key(&id, i),
                Bytes::copy_from_slice(chunk),
            )
            .await?;
    }
    Ok(Some(Parts {
        id,
        count: chunks.len(),
        bytes: body.len(),
        sha256: hex::encode(Sha256::digest(&body)),
    }))
}

/// The value `revision:{n}` holds: the whole company numbered `n`, or the
/// manifest of its parts.
pub(super) fn revision_value(company: &Company, n: u64, parts: Option<&Parts>) -> Bytes {
    let body = match parts {
        Some(p) => serde_json::to_vec(&Manifest {
            revision: n,
            in_parts: p.clone(),
        }),
        None => serde_json::to_vec(&Company {
            revision: n,
            ..company.clone()
        }),
    };
    Bytes::from(body.unwrap_or_default())
}

/// Read revision `n`, whole or from its parts.
pub(super) async fn read(store: &dyn Store, n: u64) -> Result<Company, CompanyError> {
    let e = store
        .get(StateBucket::Config, &revision_key(n))
        .await?
        .ok_or_else(|| CompanyError::Corrupt(n, "missing".into()))?;
    let body = match serde_json::from_slice::<Manifest>(&e.value) {
        Ok(m) => joined(store, n, &m.in_parts).await?,
        Err(_) => e.value.to_vec(),
    };
    let mut company: Company =
        serde_json::from_slice(&body).map_err(|err| CompanyError::Corrupt(n, err.to_string()))?;
    company.revision = n;
    Ok(company)
}

/// The parts of revision `n`, joined and checked against the manifest.
async fn joined(store: &dyn Store, n: u64, parts: &Parts) -> Result<Vec<u8>, CompanyError> {
    let mut body = Vec::with_capacity(parts.bytes.min(64 * 1024 * 1024));
    for i in 0..parts.count {
        let part = store
            .get(StateBucket::Config, &part_key(&parts.id, i))
            .await?
            .ok_or_else(|| {
                CompanyError::Corrupt(n, format!("part {} of {} is missing", i + 1, parts.count))
            })?;
        body.extend_from_slice(&part.value);
        if body.len() > parts.bytes {
            break;
        }
    }
    if body.len() != parts.bytes || hex::encode(Sha256::digest(&body)) != parts.sha256 {
        return Err(CompanyError::Corrupt(
            n,
            format!(
                "its {} parts hold {} bytes that do not match the manifest ({} bytes, sha256 {})",
                parts.count,
                body.len(),
                parts.bytes,
                parts.sha256
            ),
        ));
    }
    Ok(body)
}
