//! Reaching the NATS store: the connection ([`NatsBackend::connect`]: its
//! options, credentials and TLS, reconnecting forever) and the buckets'
//! streams, made or adopted from a peer ([`ensure_bucket`]), with the lease
//! TTL and atomic claims the fleet has in force.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use async_nats::jetstream::{self, kv, stream};
use tokio::sync::watch;

use super::{ATOMIC_API_LEVEL, Clock, NatsBackend, NatsOptions, jetstream_code, stream_name};
use crate::coord::kv::BucketId;
use crate::coord::{ConnectionState, StoreError};

impl NatsBackend {
    /// Connect, make or adopt the buckets, and read the store clock once.
    pub async fn connect(opts: &NatsOptions) -> Result<NatsBackend, StoreError> {
        if opts.urls.is_empty() {
            return Err(StoreError::Unavailable(
                "no stream.urls to connect to".into(),
            ));
        }
        let (events_tx, events) = watch::channel(ConnectionState::Pending);
        let events_tx = Arc::new(events_tx);
        let connected = Arc::clone(&events_tx);
        let co = connect_options(opts, events_tx).await?;
        let addrs = opts
            .urls
            .iter()
            .map(|u| {
                u.parse::<async_nats::ServerAddr>()
                    .map_err(|e| StoreError::Unavailable(format!("stream url {u}: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let client = co
            .connect(addrs)
            .await
            .map_err(|e| StoreError::Unavailable(e.to_string()))?;
        let mut js = jetstream::new(client.clone());
        js.set_timeout(opts.store_timeout);

        let level = crate::jetstream_api::api_level(&client, opts.store_timeout).await;
        let atomic = opts.atomic_claim && level >= ATOMIC_API_LEVEL;
        if opts.atomic_claim && !atomic {
            tracing::warn!(
                api_level = level,
                "coordination.atomic_claim is on but the server's JetStream API level is {level} \
                 (atomic batches need {ATOMIC_API_LEVEL}: nats-server 2.12 or later); claims use three writes"
            );
        }
        let buckets = open_buckets(&js, opts, atomic).await?;
        if client.connection_state() == async_nats::connection::State::Connected {
            connected.send_replace(ConnectionState::Connected);
        }
        let backend = NatsBackend {
            client,
            js,
            stores: buckets.stores,
            ttl: buckets.ttl,
            timeout: opts.store_timeout,
            clock: Arc::new(Clock::new()),
            events,
            atomic: buckets.atomic,
            epoch_keys: buckets.epoch_keys,
            stamp_reads: AtomicU64::new(0),
        };
        backend.probe_clock().await?;
        Ok(backend)
    }
}

/// The client's options: its name, reconnecting forever, every call bounded
/// by the store timeout, the connection's state told through `events_tx`,
/// and the credentials and TLS the options name.
async fn connect_options(
    opts: &NatsOptions,
    events_tx: Arc<watch::Sender<ConnectionState>>,
) -> Result<async_nats::ConnectOptions, StoreError> {
    let mut co = async_nats::ConnectOptions::new()
        .name(&opts.name)
        .max_reconnects(None)
        .connection_timeout(opts.store_timeout)
        .request_timeout(Some(opts.store_timeout))
        .event_callback(move |ev| {
            let tx = events_tx.clone();
            async move {
                match ev {
                    async_nats::Event::Connected => {
                        tracing::info!("coordination store connected");
                        tx.send_replace(ConnectionState::Connected);
                    }
                    async_nats::Event::Disconnected => {
                        tracing::warn!("coordination store disconnected; reconnecting");
                        tx.send_replace(ConnectionState::Disconnected);
                    }
                    other => {
                        tracing::debug!(event = %other, "coordination store connection event")
                    }
                }
            }
        });
    if let Some(path) = &opts.creds_file {
        co = co
            .credentials_file(path)
            .await
            .map_err(|e| StoreError::Unavailable(format!("creds file {}: {e}", path.display())))?;
    }
    if let (Some(u), Some(p)) = (&opts.user, &opts.password) {
        co = co.user_and_password(u.clone(), p.clone());
    }
    if let Some(ca) = &opts.tls_ca_file {
        co = co.add_root_certificates(ca.clone());
    }
    if opts.urls.iter().any(|u| u.starts_with("tls://")) {
        // A `tls://` URL is a promise: never fall back to plain text.
        co = co.require_tls(true);
    }
    Ok(co)
}

/// Every bucket opened, and what the fleet has in force.
struct Buckets {
    stores: HashMap<BucketId, kv::Store>,
    /// The lease TTL: the leases bucket's age limit.
    ttl: Duration,
    /// Claims are atomic batches.
    atomic: bool,
    /// Epoch keys exist: the leases bucket was switched to atomic batches
    /// (by a store with `atomic_claim`), so they are read there.
    epoch_keys: bool,
}

/// Make or adopt every bucket's stream and open it.
async fn open_buckets(
    js: &jetstream::Context,
    opts: &NatsOptions,
    atomic: bool,
) -> Result<Buckets, StoreError> {
    let mut buckets = Buckets {
        stores: HashMap::new(),
        ttl: opts.lease_ttl,
        atomic,
        epoch_keys: false,
    };
    for b in BucketId::ALL {
        let found = ensure_bucket(js, b, opts.lease_ttl, opts.replicas, atomic).await?;
        if b == BucketId::Leases {
            buckets.epoch_keys |= found.atomic;
            buckets.atomic &= found.atomic;
            if let Some(age) = found.max_age {
                buckets.ttl = age;
            }
        }
        let store = js
            .get_key_value(b.name())
            .await
            .map_err(|e| StoreError::Unavailable(format!("bucket {}: {e}", b.name())))?;
        buckets.stores.insert(b, store);
    }
    Ok(buckets)
}

/// What [`ensure_bucket`] found in force.
struct Found {
    /// The stream's age limit, when it has one.
    max_age: Option<Duration>,
    /// It takes atomic batches and per-message TTLs.
    atomic: bool,
}

/// The stream bucket `b` wants (pure). `atomic`: the leases bucket takes
/// atomic batches and per-message TTLs.
fn bucket_config(b: BucketId, max_age: Duration, replicas: usize, atomic: bool) -> stream::Config {
    stream::Config {
        name: stream_name(b),
        subjects: vec![format!("$KV.{}.>", b.name())],
        max_messages_per_subject: 1,
        max_age,
        max_bytes: -1,
        max_messages: -1,
        max_message_size: -1,
        max_consumers: -1,
        discard: stream::DiscardPolicy::New,
        allow_rollup: true,
        deny_delete: true,
        allow_direct: false,
        num_replicas: replicas.max(1),
        duplicate_window: if max_age.is_zero() {
            Duration::from_secs(120)
        } else {
            max_age.min(Duration::from_secs(120))
        },
        storage: stream::StorageType::File,
        allow_atomic_publish: atomic,
        allow_message_ttl: atomic,
        ..Default::default()
    }
}

/// Create bucket `b`'s stream, or find the one a peer made. `atomic`: the
/// leases bucket must take atomic batches and per-message TTLs (an atomic
/// claim's epoch key never expires): switched on in a stream made without.
async fn ensure_bucket(
    js: &jetstream::Context,
    b: BucketId,
    lease_ttl: Duration,
    replicas: usize,
    atomic: bool,
) -> Result<Found, StoreError> {
    let atomic = atomic && b == BucketId::Leases;
    let name = stream_name(b);
    let max_age = b.max_age(lease_ttl).unwrap_or(Duration::ZERO);
    let config = bucket_config(b, max_age, replicas, atomic);
    let info = |e: &dyn std::fmt::Display| StoreError::Unavailable(format!("stream {name}: {e}"));
    let found = match js.get_stream(&name).await {
        Ok(mut s) => Some(s.info().await.map_err(|e| info(&e))?.config.clone()),
        Err(e)
            if jetstream_code(&e, |k| match k {
                jetstream::context::GetStreamErrorKind::JetStream(j) => Some(j),
                _ => None,
            }) == Some(jetstream::ErrorCode::STREAM_NOT_FOUND) =>
        {
            None
        }
        Err(e) => return Err(info(&e)),
    };
    let mut in_force = match found {
        Some(c) => c,
        None => match js.create_stream(config.clone()).await {
            Ok(mut s) => s.info().await.map(|i| i.config.clone()).unwrap_or(config),
            Err(e) => {
                // A peer made it between our look and our create: adopt theirs.
                let mut s = js.get_stream(&name).await.map_err(|_| info(&e))?;
                s.info().await.map_err(|e| info(&e))?.config.clone()
            }
        },
    };
    if atomic && !(in_force.allow_atomic_publish && in_force.allow_message_ttl) {
        in_force = switch_on_atomic(js, b, in_force).await;
    }
    let actual = in_force.max_age;
    if b == BucketId::Leases && actual != max_age {
        tracing::warn!(
            configured_ttl_seconds = lease_ttl.as_secs_f64(),
            bucket_ttl_seconds = actual.as_secs_f64(),
            bucket = b.name(),
            "lease TTL adopted from the bucket a peer created: {}s in force, not the configured {}s",
            actual.as_secs_f64(),
            lease_ttl.as_secs_f64()
        );
    }
    Ok(Found {
        max_age: (!actual.is_zero()).then_some(actual),
        atomic: in_force.allow_atomic_publish && in_force.allow_message_ttl,
    })
}

/// A leases bucket made by a node that did not claim atomically: switch
/// atomic batches and per-message TTLs on (the server allows it on a live
/// stream; neither is switched off). What is in force after.
async fn switch_on_atomic(
    js: &jetstream::Context,
    b: BucketId,
    in_force: stream::Config,
) -> stream::Config {
    let mut wanted = in_force.clone();
    wanted.allow_atomic_publish = true;
    wanted.allow_message_ttl = true;
    match js.update_stream(wanted).await {
        Ok(i) => i.config,
        Err(e) => {
            tracing::warn!(
                bucket = b.name(),
                error = %e,
                "cannot switch on atomic batches in the leases bucket; claims use three writes"
            );
            in_force
        }
    }
}
