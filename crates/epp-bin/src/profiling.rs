//! `--enable-pprof`: `GET /debug/pprof/profile?seconds=N` on the metrics port
//! answers a CPU profile of the whole process in the pprof protobuf format
//! (what Go's `net/http/pprof` serves, so `go tool pprof URL` reads it).
//! Sampled at 100 Hz, as Go does, with symbols resolved in the process (the
//! profile names functions; no binary is needed to read it). One profile at
//! a time: a second request while one runs gets 409.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use pprof::protos::Message;
use tokio_util::sync::CancellationToken;

/// Samples per second.
const FREQUENCY: i32 = 100;
/// `seconds` when the request names none, as Go's handler.
pub(crate) const DEFAULT_SECONDS: u64 = 30;
/// The longest profile served.
pub(crate) const MAX_SECONDS: u64 = 60;

/// Why no profile was made.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ProfileError {
    /// 400: `seconds` is not a whole number in 1..=MAX_SECONDS.
    BadSeconds(String),
    /// 409: another profile is being taken.
    Busy,
    /// 503: epp is shutting down.
    ShuttingDown,
    /// 500: the profiler failed (it says why).
    Failed(String),
}

impl std::fmt::Display for ProfileError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::BadSeconds(v) => write!(
                f,
                "invalid seconds={v:?}: a whole number from 1 to {MAX_SECONDS}"
            ),
            Self::Busy => f.write_str("a CPU profile is already being taken; retry when it ends"),
            Self::ShuttingDown => f.write_str("epp is shutting down"),
            Self::Failed(why) => write!(f, "profiling failed: {why}"),
        }
    }
}

/// The duration a query string asks for (`seconds=N`, default 30).
pub(crate) fn seconds(query: Option<&str>) -> Result<Duration, ProfileError> {
    let value = query
        .unwrap_or_default()
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == "seconds")
        .map(|(_, v)| v);
    let Some(value) = value else {
        return Ok(Duration::from_secs(DEFAULT_SECONDS));
    };
    match value.parse::<u64>() {
        Ok(n) if (1..=MAX_SECONDS).contains(&n) => Ok(Duration::from_secs(n)),
        _ => Err(ProfileError::BadSeconds(value.to_owned())),
    }
}

/// Takes CPU profiles, one at a time.
#[derive(Debug, Clone)]
pub(crate) struct Profiler {
    busy: Arc<AtomicBool>,
    shutdown: CancellationToken,
}

/// Clears the busy flag however the profile ends.
struct Slot(Arc<AtomicBool>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl Profiler {
    pub(crate) fn new(shutdown: CancellationToken) -> Self {
        Self {
            busy: Arc::new(AtomicBool::new(false)),
            shutdown,
        }
    }

    /// Profiles the process for `duration`; the pprof protobuf bytes.
    pub(crate) async fn profile(&self, duration: Duration) -> Result<Vec<u8>, ProfileError> {
        if self.busy.swap(true, Ordering::AcqRel) {
            return Err(ProfileError::Busy);
        }
        let _slot = Slot(Arc::clone(&self.busy));
        let guard = pprof::ProfilerGuardBuilder::default()
            .frequency(FREQUENCY)
            // Unwinding from inside these can deadlock in the signal handler.
            .blocklist(&["libc", "libgcc", "pthread", "vdso"])
            .build()
            .map_err(|e| ProfileError::Failed(e.to_string()))?;
        tracing::info!(?duration, "CPU profile started");
        tokio::select! {
            () = tokio::time::sleep(duration) => {}
            () = self.shutdown.cancelled() => return Err(ProfileError::ShuttingDown),
        }
        // Resolving symbols takes a moment of CPU: off the async workers.
        let encoded = tokio::task::spawn_blocking(move || {
            let report = guard.report().build().map_err(|e| e.to_string())?;
            drop(guard);
            let profile = report.pprof().map_err(|e| e.to_string())?;
            Ok::<_, String>(profile.encode_to_vec())
        })
        .await
        .map_err(|e| ProfileError::Failed(e.to_string()))?
        .map_err(ProfileError::Failed)?;
        tracing::info!(bytes = encoded.len(), "CPU profile taken");
        Ok(encoded)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_are_bounded() {
        assert_eq!(seconds(None), Ok(Duration::from_secs(DEFAULT_SECONDS)));
        assert_eq!(seconds(Some("debug=1")), Ok(Duration::from_secs(30)));
        assert_eq!(seconds(Some("seconds=1")), Ok(Duration::from_secs(1)));
        assert_eq!(seconds(Some("x=y&seconds=60")), Ok(Duration::from_secs(60)));
        for bad in [
            "seconds=0",
            "seconds=61",
            "seconds=-1",
            "seconds=1.5",
            "seconds=",
        ] {
            assert!(
                matches!(seconds(Some(bad)), Err(ProfileError::BadSeconds(_))),
                "{bad}"
            );
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_profile_at_a_time_and_it_decodes() {
        let p = Profiler::new(CancellationToken::new());
        let first = {
            let p = p.clone();
            tokio::spawn(async move { p.profile(Duration::from_secs(1)).await })
        };
        // Burn some CPU so there is something to sample, and try a second one meanwhile.
        let mut x = 0u64;
        let mut second = None;
        while !first.is_finished() {
            for i in 0..100_000u64 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
            }
            if second.is_none() && p.busy.load(Ordering::Acquire) {
                second = Some(p.profile(Duration::from_secs(1)).await);
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(second, Some(Err(ProfileError::Busy)));
        let bytes = first.await.unwrap().unwrap();
        let profile = pprof::protos::Profile::decode(bytes.as_slice()).unwrap();
        assert!(!profile.sample_type.is_empty());
        assert!(!p.busy.load(Ordering::Acquire), "free again");
    }
}
