//! A prefix index shared by several epp replicas (llm-d's `redisConfig` /
//! `valkeyConfig` backends), and the lookup the edge runs in it before a
//! request's scheduling cycle.
//!
//! The scheduling cycle is synchronous: it never waits for the network. A
//! plugin whose index lives in another process therefore asks, through
//! [`crate::Plugin::prefix_lookup`], for a lookup the edge awaits after the
//! prompt is rendered and before flow control and the cycle; the answer
//! travels in the request ([`crate::InferenceRequest::shared_prefix`]) to
//! the cycle, where the plugin reads it. The store itself is created by the
//! binary from the plugin's [`SharedIndexSpec`] and handed back to it
//! ([`crate::Plugin::bind_shared_index`]), so plugins do no I/O of their own.

use std::{fmt, future::Future, pin::Pin, sync::Arc, time::Duration};

use crate::InferenceRequest;

/// Where a plugin's shared index lives, as its config names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedIndexSpec {
    /// The server.
    pub address: RedisAddress,
    /// `redis` or `valkey` (the same protocol).
    pub backend: String,
    /// How long a lookup may take before the request is scheduled without
    /// it (matched in the replica's own view instead).
    pub lookup_timeout: Duration,
}

/// Leading blocks each endpoint holds, by endpoint address (`ip:port`).
pub type HolderCounts = Vec<(String, u32)>;

/// A lookup in a shared index: each endpoint's leading blocks of the keys
/// asked, or why there is no answer.
pub type SharedLookupFuture = Pin<Box<dyn Future<Output = Result<HolderCounts, String>> + Send>>;

/// Calls `f(endpoint address, keys it holds)` for every endpoint a replica
/// knows: what it writes to a store that lost its contents or its updates.
pub type Snapshot = Arc<dyn Fn(&mut dyn FnMut(&str, &[u64])) + Send + Sync>;

/// A block index shared between replicas: which endpoint (by address) holds
/// which block key.
///
/// Writes are queued and never block; a store that cannot keep up or is
/// unreachable drops them and, once it can write again, rewrites the
/// replica's whole view from the [`Snapshot`]. Lookups never fail the
/// request: an error or a timeout is an unanswered lookup, and the caller
/// matches in its own view instead.
pub trait SharedBlockIndex: Send + Sync + fmt::Debug {
    /// `endpoint` now holds `added` and no longer holds `removed`.
    fn update(&self, endpoint: &str, added: &[u64], removed: &[u64]);
    /// How many of `keys`, counting from the first without a gap, each
    /// endpoint holds (endpoints holding none are left out).
    fn lookup(&self, keys: Vec<u64>) -> SharedLookupFuture;
    /// Where the store reads this replica's whole view when it must rewrite
    /// it (on connecting, after dropped updates).
    fn set_snapshot(&self, snapshot: Snapshot);
    /// What the store has done so far.
    fn stats(&self) -> SharedIndexStats;
}

/// Counters of a [`SharedBlockIndex`], for the owning plugin's metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SharedIndexStats {
    /// Whether it is connected now.
    pub connected: bool,
    /// Lookups asked.
    pub lookups: u64,
    /// Of those, not answered (error, timeout, not connected).
    pub unanswered: u64,
    /// Updates dropped (not connected, or more queued than it could write);
    /// each drop leads to a rewrite of the whole view.
    pub dropped_updates: u64,
    /// Times the whole view was written (each connection, each drop).
    pub resyncs: u64,
}

/// What a shared index answered for a request, before its cycle.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SharedPrefixMatch {
    /// The plugin that asked ([`PrefixLookup`]'s own id): only it reads this.
    pub producer: u64,
    /// The request's block keys, in order.
    pub keys: Vec<u64>,
    /// Leading blocks per endpoint address (none when nothing matched or
    /// the store did not answer).
    pub matched: HolderCounts,
    /// Whether the store answered in time.
    pub answered: bool,
}

/// A finished lookup.
pub type PrefixLookupFuture = Pin<Box<dyn Future<Output = SharedPrefixMatch> + Send>>;

/// A prefix lookup that needs I/O, run by the edge before the scheduling
/// cycle (after the prompt is rendered to token ids).
pub trait PrefixLookup: Send + Sync + fmt::Debug {
    /// The lookup for `request`, or `None` when there is nothing to look up
    /// (no token ids, or no store bound). Computes the keys before
    /// returning; the future only waits for the store, and ends by the
    /// store's timeout.
    fn lookup(&self, request: &InferenceRequest) -> Option<PrefixLookupFuture>;
}

/// A Redis or Valkey server's address, as llm-d writes it:
/// `redis://[[user]:password@]host[:port][/db]` (`valkey://` alike; a bare
/// `host:port` is taken as `redis://host:port`).
#[derive(Clone, PartialEq, Eq)]
pub struct RedisAddress {
    /// Host name or IP (IPv6 without brackets).
    pub host: String,
    /// Port (6379 when not given).
    pub port: u16,
    /// ACL user, if any.
    pub username: Option<String>,
    /// Password, if any.
    pub password: Option<String>,
    /// Database number (0 when not given).
    pub db: u32,
}

impl fmt::Debug for RedisAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the password.
        f.debug_struct("RedisAddress")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("username", &self.username)
            .field("db", &self.db)
            .finish_non_exhaustive()
    }
}

impl RedisAddress {
    /// Parses `text`.
    ///
    /// # Errors
    /// Another scheme (TLS ones included: not supported), no host, a port
    /// or database that is not a number, anything after the database.
    pub fn parse(text: &str) -> Result<Self, String> {
        let rest = match text.split_once("://") {
            Some(("redis" | "valkey", rest)) => rest,
            Some(("rediss" | "valkeys", _)) => {
                return Err("TLS connections (rediss://, valkeys://) are not supported".into());
            }
            Some((scheme, _)) => {
                return Err(format!("unknown scheme {scheme:?} (redis:// or valkey://)"));
            }
            None => text,
        };
        let (authority, db) = match rest.split_once('/') {
            Some((a, "")) => (a, 0),
            Some((a, db)) => (
                a,
                db.parse()
                    .map_err(|_| format!("database {db:?} is not a number"))?,
            ),
            None => (rest, 0),
        };
        let (userinfo, hostport) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        let (username, password) = match userinfo {
            None => (None, None),
            Some(u) => match u.split_once(':') {
                Some((user, pass)) => (
                    (!user.is_empty()).then(|| user.to_owned()),
                    Some(pass.to_owned()),
                ),
                None => (None, Some(u.to_owned())),
            },
        };
        let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
            let (h, after) = v6
                .split_once(']')
                .ok_or_else(|| format!("unclosed '[' in {hostport:?}"))?;
            (h, after.strip_prefix(':'))
        } else {
            match hostport.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (hostport, None),
            }
        };
        if host.is_empty() {
            return Err("no host".into());
        }
        let port = match port {
            None => 6379,
            Some(p) => p
                .parse()
                .map_err(|_| format!("port {p:?} is not a number from 0 to 65535"))?,
        };
        Ok(Self {
            host: host.to_owned(),
            port,
            username,
            password,
            db,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_llm_d_addresses() {
        let a = RedisAddress::parse("redis://127.0.0.1:6379").unwrap();
        assert_eq!((a.host.as_str(), a.port, a.db), ("127.0.0.1", 6379, 0));
        assert_eq!(a.password, None);
        let a = RedisAddress::parse("valkey://cache.svc").unwrap();
        assert_eq!((a.host.as_str(), a.port), ("cache.svc", 6379));
        let a = RedisAddress::parse("redis://bob:s3cret@h:7000/2").unwrap();
        assert_eq!(a.username.as_deref(), Some("bob"));
        assert_eq!(a.password.as_deref(), Some("s3cret"));
        assert_eq!((a.port, a.db), (7000, 2));
        assert!(!format!("{a:?}").contains("s3cret"));
        let a = RedisAddress::parse("redis://:pw@h").unwrap();
        assert_eq!((a.username, a.password.as_deref()), (None, Some("pw")));
        let a = RedisAddress::parse("h:1").unwrap();
        assert_eq!((a.host.as_str(), a.port), ("h", 1));
        let a = RedisAddress::parse("redis://[::1]:6380").unwrap();
        assert_eq!((a.host.as_str(), a.port), ("::1", 6380));
    }

    #[test]
    fn refuses_what_it_cannot_connect_to() {
        for (text, why) in [
            ("rediss://h", "TLS"),
            ("http://h", "scheme"),
            ("redis://", "no host"),
            ("redis://h:x", "port"),
            ("redis://h:70000", "port"),
            ("redis://h/x", "database"),
            ("redis://[::1", "unclosed"),
        ] {
            let e = RedisAddress::parse(text).unwrap_err();
            assert!(e.contains(why), "{text}: {e}");
        }
    }
}
