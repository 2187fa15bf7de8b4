//! Waiting for something another task or process does, with a bound that
//! fails the test instead of hanging it. The bounds are generous for a slow,
//! shared machine; they are not timing assertions.

use std::{future::Future, time::Duration};

/// Polls `f` every 50 ms until it returns `Some`, at most `tries` times;
/// panics naming `what` after that.
pub async fn poll<T, F, Fut>(what: &str, tries: usize, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    for _ in 0..tries {
        if let Some(v) = f().await {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("gave up waiting for {what}");
}

/// Polls `cond` every 10 ms until it holds; panics naming `what` after 20 s.
pub async fn eventually<F, Fut>(what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    for _ in 0..2000 {
        if cond().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting until {what}");
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn poll_returns_the_first_value_and_gives_up_after_its_tries() {
        let calls = AtomicU32::new(0);
        let got = poll("the third call", 5, || async {
            let n = calls.fetch_add(1, Ordering::Relaxed) + 1;
            (n == 3).then_some(n)
        })
        .await;
        assert_eq!(got, 3);

        let never = tokio::spawn(poll("nothing", 4, || async { None::<()> }));
        let err = never.await.expect_err("must panic");
        assert!(err.is_panic());
    }

    #[tokio::test(start_paused = true)]
    async fn eventually_waits_for_the_condition_and_panics_without_it() {
        let calls = AtomicU32::new(0);
        eventually("the fifth call", || async {
            calls.fetch_add(1, Ordering::Relaxed) == 4
        })
        .await;
        assert_eq!(calls.load(Ordering::Relaxed), 5);

        let never = tokio::spawn(eventually("false", || async { false }));
        assert!(never.await.expect_err("must panic").is_panic());
    }
}
