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

/// Whether a function is the sampler's own (the unwinder called from the
/// signal handler).
fn is_sampler_frame(name: &str) -> bool {
    name.starts_with("backtrace::") || name.contains("pprof::")
}

/// Removes the sampler's own frames from the leaf end of every sample: the
/// pprof crate keeps the unwinder's frames that are not inlined into its
/// signal handler (all of them in a debug build), which would put every
/// sample's own time on `backtrace::…::trace`. A sample made only of such
/// frames is left as it is.
fn strip_sampler_frames(profile: &mut pprof::protos::Profile) {
    let name = |index: i64| {
        usize::try_from(index)
            .ok()
            .and_then(|i| profile.string_table.get(i))
            .map(String::as_str)
            .unwrap_or_default()
    };
    let sampler_functions: std::collections::HashSet<u64> = profile
        .function
        .iter()
        .filter(|f| is_sampler_frame(name(f.name)))
        .map(|f| f.id)
        .collect();
    let sampler_locations: std::collections::HashSet<u64> = profile
        .location
        .iter()
        .filter(|l| {
            !l.line.is_empty()
                && l.line
                    .iter()
                    .all(|line| sampler_functions.contains(&line.function_id))
        })
        .map(|l| l.id)
        .collect();
    for sample in &mut profile.sample {
        let own = sample
            .location_id
            .iter()
            .take_while(|id| sampler_locations.contains(id))
            .count();
        if own < sample.location_id.len() {
            sample.location_id.drain(..own);
        }
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
            let mut profile = report.pprof().map_err(|e| e.to_string())?;
            strip_sampler_frames(&mut profile);
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
        assert!(!profile.sample.is_empty(), "the busy loop was sampled");
        let leaf_names: Vec<&str> = profile
            .sample
            .iter()
            .filter_map(|s| s.location_id.first())
            .filter_map(|id| profile.location.iter().find(|l| l.id == *id))
            .filter_map(|l| l.line.first())
            .filter_map(|line| profile.function.iter().find(|f| f.id == line.function_id))
            .map(|f| profile.string_table[usize::try_from(f.name).unwrap()].as_str())
            .collect();
        assert!(
            leaf_names.iter().all(|n| !is_sampler_frame(n)),
            "no sample ends in the sampler itself: {leaf_names:?}"
        );
        assert!(!p.busy.load(Ordering::Acquire), "free again");
    }
}
