//! Who may read the metrics port (`/metrics`, and `/debug/pprof/profile`).
//!
//! - Against a cluster, with `--metrics-endpoint-auth` (on by default, as in
//!   the reference): the request's bearer token is checked with a
//!   TokenReview, and the user it names (with its groups, uid and extra) is
//!   authorised with a SubjectAccessReview for the request's verb (`get`) on
//!   the non-resource URL of its path — what the reference's
//!   `metrics-reader` ClusterRole grants. Answers are cached per token (a
//!   SHA-256 of it, never the token) and path for [`CACHE_TTL`], at most
//!   [`CACHE_ENTRIES`] of them.
//! - Without a cluster, or with `--metrics-endpoint-auth=false`:
//!   `EPP_METRICS_BEARER_TOKEN`, when set, is the one token accepted;
//!   otherwise the port is open.
//!
//! When the API server cannot answer (unreachable, timed out, or epp may not
//! create the reviews) the request is refused with 503: fail closed, and a
//! status that tells a scraper to retry rather than that its token is bad.
//! The change between answering and not is logged once each way.

use std::{
    collections::HashMap,
    future::Future,
    sync::atomic::{AtomicBool, Ordering},
    time::Duration,
};

use k8s_openapi::api::{
    authentication::v1::{TokenReview, TokenReviewSpec, UserInfo},
    authorization::v1::{
        NonResourceAttributes, ResourceAttributes, SelfSubjectAccessReview,
        SelfSubjectAccessReviewSpec, SubjectAccessReview, SubjectAccessReviewSpec,
    },
};
use kube::{Api, Client, api::PostParams};
use parking_lot::Mutex;
use tokio::time::Instant;

/// How long an answer (allowed, forbidden, invalid token) is reused.
pub(crate) const CACHE_TTL: Duration = Duration::from_secs(10);
/// Most answers kept; beyond, expired ones are dropped, then all.
pub(crate) const CACHE_ENTRIES: usize = 1024;
/// Longest wait for one review from the API server.
const REVIEW_TIMEOUT: Duration = Duration::from_secs(5);

/// What a request to the metrics port may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Serve it.
    Allowed,
    /// 401: no token, or one the cluster (or the static token) does not accept.
    Unauthenticated,
    /// 403: a valid token whose user lacks the permission; names the user.
    Forbidden(String),
    /// 503: the API server could not be asked.
    Unavailable,
}

/// The authentication in force on the metrics port.
#[derive(Debug)]
pub(crate) enum MetricsAuth {
    /// Anyone may read.
    Open,
    /// `EPP_METRICS_BEARER_TOKEN`: the SHA-256 of the one accepted token.
    StaticToken(ring::digest::Digest),
    /// TokenReview + SubjectAccessReview against the cluster.
    Kube(KubeAuth<ApiReviewer>),
}

impl MetricsAuth {
    /// A static token (empty means none).
    pub(crate) fn static_token(token: &str) -> Self {
        if token.is_empty() {
            Self::Open
        } else {
            Self::StaticToken(sha256(token.as_bytes()))
        }
    }

    /// What to do with a request for `path` with verb `verb` (the HTTP
    /// method, lower-cased) and the `Authorization` header `authorization`.
    pub(crate) async fn check(
        &self,
        authorization: Option<&str>,
        verb: &str,
        path: &str,
    ) -> Verdict {
        match self {
            Self::Open => Verdict::Allowed,
            Self::StaticToken(want) => match bearer(authorization) {
                // Comparing digests: the time taken says nothing about the token.
                Some(t) if sha256(t.as_bytes()).as_ref() == want.as_ref() => Verdict::Allowed,
                _ => Verdict::Unauthenticated,
            },
            Self::Kube(kube) => match bearer(authorization) {
                Some(token) => kube.check(token, verb, path).await,
                None => Verdict::Unauthenticated,
            },
        }
    }

    /// A short name for the start-up line.
    pub(crate) fn describe(&self) -> &'static str {
        match self {
            Self::Open => "none",
            Self::StaticToken(_) => "static bearer token",
            Self::Kube(_) => "kubernetes TokenReview + SubjectAccessReview",
        }
    }
}

/// The authentication the flags ask for: `flag` is `--metrics-endpoint-auth`
/// (`None` when not given), `client` the cluster's when epp runs against
/// one, `static_token` EPP_METRICS_BEARER_TOKEN.
///
/// # Errors
/// `--metrics-endpoint-auth=true` without a cluster: asked-for protection
/// that cannot be given is an error, not an open port.
pub(crate) async fn choose(
    flag: Option<bool>,
    client: Option<Client>,
    static_token: Option<String>,
) -> anyhow::Result<MetricsAuth> {
    let fallback = || MetricsAuth::static_token(static_token.as_deref().unwrap_or_default());
    match (flag, client) {
        (Some(true), None) => anyhow::bail!(
            "--metrics-endpoint-auth needs a cluster to review tokens (--pool-name without static endpoints, or --endpoint-selector); without one, set EPP_METRICS_BEARER_TOKEN"
        ),
        (Some(false), _) | (None, None) => Ok(fallback()),
        (Some(true) | None, Some(client)) => {
            if static_token.is_some_and(|t| !t.is_empty()) {
                tracing::warn!(
                    "EPP_METRICS_BEARER_TOKEN is ignored: the metrics port reviews tokens with the cluster (--metrics-endpoint-auth=false uses the static token instead)"
                );
            }
            let reviewer = ApiReviewer::new(client);
            match reviewer.missing_permissions().await {
                Ok(missing) if missing.is_empty() => {}
                Ok(missing) => tracing::warn!(
                    missing = %missing.join(", "),
                    "metrics authentication: epp may not create these reviews; the metrics port answers 503 until its ServiceAccount may (see docs/kubernetes.md, RBAC)"
                ),
                Err(e) => {
                    tracing::warn!(error = %e, "metrics authentication: cannot check epp's own permissions")
                }
            }
            Ok(MetricsAuth::Kube(KubeAuth::new(reviewer)))
        }
    }
}

fn sha256(bytes: &[u8]) -> ring::digest::Digest {
    ring::digest::digest(&ring::digest::SHA256, bytes)
}

/// The token of an `Authorization: Bearer <token>` header (scheme in any case).
fn bearer(header: Option<&str>) -> Option<&str> {
    let (scheme, token) = header?.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Why a review could not be had.
#[derive(Debug, Clone)]
pub(crate) struct ReviewError(String);

impl std::fmt::Display for ReviewError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Asks the cluster about tokens and permissions (a trait so the cache and
/// the fail-closed logic are tested without an API server).
pub(crate) trait Reviewer: Send + Sync {
    /// The user a token authenticates as; `None` when it does not.
    fn authenticate(
        &self,
        token: &str,
    ) -> impl Future<Output = Result<Option<UserInfo>, ReviewError>> + Send;

    /// Whether `user` may `verb` the non-resource URL `path`.
    fn authorize(
        &self,
        user: &UserInfo,
        verb: &str,
        path: &str,
    ) -> impl Future<Output = Result<bool, ReviewError>> + Send;
}

/// [`Reviewer`] through the API server, as epp's own ServiceAccount (which
/// needs `create` on `tokenreviews` and `subjectaccessreviews`).
#[derive(Clone)]
pub(crate) struct ApiReviewer(Client);

impl std::fmt::Debug for ApiReviewer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiReviewer")
    }
}

impl ApiReviewer {
    pub(crate) fn new(client: Client) -> Self {
        Self(client)
    }

    /// The reviews epp may not create (checked at start, to warn early).
    pub(crate) async fn missing_permissions(&self) -> Result<Vec<&'static str>, ReviewError> {
        let api: Api<SelfSubjectAccessReview> = Api::all(self.0.clone());
        let mut missing = Vec::new();
        for (group, resource) in [
            ("authentication.k8s.io", "tokenreviews"),
            ("authorization.k8s.io", "subjectaccessreviews"),
        ] {
            let review = SelfSubjectAccessReview {
                spec: SelfSubjectAccessReviewSpec {
                    resource_attributes: Some(ResourceAttributes {
                        group: Some(group.to_owned()),
                        resource: Some(resource.to_owned()),
                        verb: Some("create".to_owned()),
                        ..ResourceAttributes::default()
                    }),
                    ..SelfSubjectAccessReviewSpec::default()
                },
                ..SelfSubjectAccessReview::default()
            };
            let answer = timed(api.create(&PostParams::default(), &review)).await?;
            if !answer.status.is_some_and(|s| s.allowed) {
                missing.push(resource);
            }
        }
        Ok(missing)
    }
}

async fn timed<T>(call: impl Future<Output = Result<T, kube::Error>>) -> Result<T, ReviewError> {
    match tokio::time::timeout(REVIEW_TIMEOUT, call).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(ReviewError(e.to_string())),
        Err(_) => Err(ReviewError(format!(
            "no answer from the API server within {REVIEW_TIMEOUT:?}"
        ))),
    }
}

impl Reviewer for ApiReviewer {
    async fn authenticate(&self, token: &str) -> Result<Option<UserInfo>, ReviewError> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                audiences: None,
            },
            ..TokenReview::default()
        };
        let api: Api<TokenReview> = Api::all(self.0.clone());
        let answer = timed(api.create(&PostParams::default(), &review)).await?;
        Ok(answer
            .status
            .filter(|s| s.authenticated == Some(true))
            .and_then(|s| s.user))
    }

    async fn authorize(
        &self,
        user: &UserInfo,
        verb: &str,
        path: &str,
    ) -> Result<bool, ReviewError> {
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: user.username.clone(),
                groups: user.groups.clone(),
                uid: user.uid.clone(),
                extra: user.extra.clone(),
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some(path.to_owned()),
                    verb: Some(verb.to_owned()),
                }),
                ..SubjectAccessReviewSpec::default()
            },
            ..SubjectAccessReview::default()
        };
        let api: Api<SubjectAccessReview> = Api::all(self.0.clone());
        let answer = timed(api.create(&PostParams::default(), &review)).await?;
        Ok(answer
            .status
            .is_some_and(|s| s.allowed && s.denied != Some(true)))
    }
}

/// A cached answer.
#[derive(Debug, Clone)]
struct Cached {
    at: Instant,
    verdict: Verdict,
}

/// TokenReview + SubjectAccessReview with a short cache, failing closed.
#[derive(Debug)]
pub(crate) struct KubeAuth<R> {
    reviewer: R,
    /// Keyed by SHA-256 of (token, verb, path).
    cache: Mutex<HashMap<[u8; 32], Cached>>,
    /// Whether the last review could be had (for logging changes once).
    available: AtomicBool,
}

impl<R: Reviewer> KubeAuth<R> {
    pub(crate) fn new(reviewer: R) -> Self {
        Self {
            reviewer,
            cache: Mutex::new(HashMap::new()),
            available: AtomicBool::new(true),
        }
    }

    fn key(token: &str, verb: &str, path: &str) -> [u8; 32] {
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
        for part in [token, verb, path] {
            ctx.update(&(part.len() as u64).to_le_bytes());
            ctx.update(part.as_bytes());
        }
        let mut key = [0; 32];
        key.copy_from_slice(ctx.finish().as_ref());
        key
    }

    async fn check(&self, token: &str, verb: &str, path: &str) -> Verdict {
        let key = Self::key(token, verb, path);
        let now = Instant::now();
        if let Some(c) = self.cache.lock().get(&key)
            && now.duration_since(c.at) < CACHE_TTL
        {
            return c.verdict.clone();
        }
        let verdict = match self.review(token, verb, path).await {
            Ok(v) => {
                if !self.available.swap(true, Ordering::AcqRel) {
                    tracing::info!("metrics authentication: the API server answers reviews again");
                }
                v
            }
            Err(e) => {
                if self.available.swap(false, Ordering::AcqRel) {
                    tracing::error!(
                        error = %e,
                        "metrics authentication: cannot review tokens; the metrics port answers 503 until the API server answers"
                    );
                }
                return Verdict::Unavailable;
            }
        };
        let mut cache = self.cache.lock();
        if cache.len() >= CACHE_ENTRIES {
            cache.retain(|_, c| now.duration_since(c.at) < CACHE_TTL);
            if cache.len() >= CACHE_ENTRIES {
                cache.clear();
            }
        }
        cache.insert(
            key,
            Cached {
                at: Instant::now(),
                verdict: verdict.clone(),
            },
        );
        verdict
    }

    async fn review(&self, token: &str, verb: &str, path: &str) -> Result<Verdict, ReviewError> {
        let Some(user) = self.reviewer.authenticate(token).await? else {
            return Ok(Verdict::Unauthenticated);
        };
        if self.reviewer.authorize(&user, verb, path).await? {
            Ok(Verdict::Allowed)
        } else {
            Ok(Verdict::Forbidden(user.username.unwrap_or_default()))
        }
    }

    #[cfg(test)]
    fn cached(&self) -> usize {
        self.cache.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;

    /// Tokens `ok-*` authenticate as `user-*`; `user-reader` may read
    /// `/metrics`; `down` makes every call fail.
    #[derive(Debug, Default)]
    struct Fake {
        calls: AtomicUsize,
        down: AtomicBool,
    }

    impl Reviewer for Fake {
        async fn authenticate(&self, token: &str) -> Result<Option<UserInfo>, ReviewError> {
            self.calls.fetch_add(1, Ordering::Relaxed);
            if self.down.load(Ordering::Relaxed) {
                return Err(ReviewError("connection refused".into()));
            }
            Ok(token.strip_prefix("ok-").map(|name| UserInfo {
                username: Some(format!("user-{name}")),
                groups: Some(vec!["g".into()]),
                ..UserInfo::default()
            }))
        }

        async fn authorize(
            &self,
            user: &UserInfo,
            verb: &str,
            path: &str,
        ) -> Result<bool, ReviewError> {
            self.calls.fetch_add(1, Ordering::Relaxed);
            assert_eq!(user.groups.as_deref(), Some(&["g".to_owned()][..]));
            Ok(user.username.as_deref() == Some("user-reader")
                && verb == "get"
                && path == "/metrics")
        }
    }

    #[test]
    fn bearer_tokens_are_parsed() {
        assert_eq!(bearer(Some("Bearer abc")), Some("abc"));
        assert_eq!(bearer(Some("bearer  abc ")), Some("abc"));
        assert_eq!(bearer(Some("Basic abc")), None);
        assert_eq!(bearer(Some("Bearer ")), None);
        assert_eq!(bearer(None), None);
    }

    #[tokio::test]
    async fn the_flag_the_cluster_and_the_static_token_choose() {
        let e = choose(Some(true), None, None).await.unwrap_err();
        assert!(
            e.to_string()
                .contains("--metrics-endpoint-auth needs a cluster"),
            "{e}"
        );
        assert!(matches!(
            choose(None, None, None).await.unwrap(),
            MetricsAuth::Open
        ));
        assert!(matches!(
            choose(None, None, Some("t".into())).await.unwrap(),
            MetricsAuth::StaticToken(_)
        ));
        assert!(matches!(
            choose(Some(false), None, Some("t".into())).await.unwrap(),
            MetricsAuth::StaticToken(_)
        ));
    }

    #[tokio::test]
    async fn a_static_token_is_the_only_one_accepted() {
        let a = MetricsAuth::static_token("s3cret");
        assert_eq!(
            a.check(Some("Bearer s3cret"), "get", "/metrics").await,
            Verdict::Allowed
        );
        assert_eq!(
            a.check(Some("Bearer s3cre"), "get", "/metrics").await,
            Verdict::Unauthenticated
        );
        assert_eq!(
            a.check(None, "get", "/metrics").await,
            Verdict::Unauthenticated
        );
        let open = MetricsAuth::static_token("");
        assert_eq!(open.check(None, "get", "/metrics").await, Verdict::Allowed);
    }

    #[tokio::test(start_paused = true)]
    async fn answers_are_cached_per_token_and_path_for_the_ttl() {
        let kube = KubeAuth::new(Fake::default());
        let calls = || kube.reviewer.calls.load(Ordering::Relaxed);
        assert_eq!(
            kube.check("ok-reader", "get", "/metrics").await,
            Verdict::Allowed
        );
        assert_eq!(calls(), 2, "a TokenReview and a SubjectAccessReview");
        assert_eq!(
            kube.check("ok-reader", "get", "/metrics").await,
            Verdict::Allowed
        );
        assert_eq!(calls(), 2, "the second answer comes from the cache");
        assert_eq!(
            kube.check("ok-reader", "get", "/debug/pprof/profile").await,
            Verdict::Forbidden("user-reader".into()),
            "a permission for /metrics is not one for another path"
        );
        assert_eq!(
            kube.check("ok-other", "get", "/metrics").await,
            Verdict::Forbidden("user-other".into())
        );
        assert_eq!(
            kube.check("bad", "get", "/metrics").await,
            Verdict::Unauthenticated
        );
        let before = calls();
        assert_eq!(
            kube.check("bad", "get", "/metrics").await,
            Verdict::Unauthenticated
        );
        assert_eq!(calls(), before, "an invalid token is cached too");

        tokio::time::advance(CACHE_TTL).await;
        assert_eq!(
            kube.check("ok-reader", "get", "/metrics").await,
            Verdict::Allowed
        );
        assert_eq!(calls(), before + 2, "asked again once the answer expired");
    }

    #[tokio::test(start_paused = true)]
    async fn the_cache_is_bounded() {
        let kube = KubeAuth::new(Fake::default());
        for i in 0..CACHE_ENTRIES + 10 {
            kube.check(&format!("ok-{i}"), "get", "/metrics").await;
        }
        assert!(kube.cached() <= CACHE_ENTRIES, "{}", kube.cached());
    }

    #[tokio::test(start_paused = true)]
    async fn an_unreachable_api_server_fails_closed_and_recovers() {
        let kube = KubeAuth::new(Fake::default());
        kube.reviewer.down.store(true, Ordering::Relaxed);
        assert_eq!(
            kube.check("ok-reader", "get", "/metrics").await,
            Verdict::Unavailable
        );
        assert!(!kube.available.load(Ordering::Relaxed));
        assert_eq!(kube.cached(), 0, "a failure is not cached");
        kube.reviewer.down.store(false, Ordering::Relaxed);
        assert_eq!(
            kube.check("ok-reader", "get", "/metrics").await,
            Verdict::Allowed
        );
        assert!(kube.available.load(Ordering::Relaxed));
    }
}
