//! `header-based-testing-filter`: the Gateway API Inference Extension
//! conformance suite's hook for steering a request to chosen endpoints.

use std::net::{IpAddr, SocketAddr};

use epp_core::{BuildError, Candidate, CycleContext, Filter, Plugin};

use crate::{Builtin, NoParams};

/// The request header naming the endpoints a request may go to.
pub const ENDPOINT_SELECTION_HEADER: &str = "test-epp-endpoint-selection";

/// `header-based-testing-filter`: keeps the candidates the request's
/// `test-epp-endpoint-selection` header names, as the conformance suite
/// expects. The header is a comma-separated list; an item `ip:port` keeps
/// that endpoint, a bare `ip` (IPv6 possibly in brackets) keeps every
/// endpoint at that address (all data-parallel ranks of a pod). Without the
/// header, or when it names nothing known, no candidate is kept (503).
///
/// Any client can steer its own requests with the header, so declare this
/// plugin only in a conformance or test deployment: it is the config switch.
#[derive(Debug, Clone)]
pub struct HeaderBasedTestingFilter {
    name: String,
}

impl Builtin for HeaderBasedTestingFilter {
    const TYPE: &'static str = "header-based-testing-filter";
    type Params = NoParams;

    fn build(name: impl Into<String>, NoParams {}: NoParams) -> Result<Self, BuildError> {
        Ok(Self { name: name.into() })
    }
}

impl Plugin for HeaderBasedTestingFilter {
    fn type_name(&self) -> &str {
        Self::TYPE
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn as_filter(&self) -> Option<&dyn Filter> {
        Some(self)
    }
}

/// One item of the header.
enum Wanted {
    Endpoint(SocketAddr),
    Address(IpAddr),
}

fn parse(item: &str) -> Option<Wanted> {
    let item = item.trim();
    if let Ok(addr) = item.parse::<SocketAddr>() {
        return Some(Wanted::Endpoint(addr));
    }
    item.trim_matches(['[', ']'])
        .parse::<IpAddr>()
        .ok()
        .map(Wanted::Address)
}

impl Filter for HeaderBasedTestingFilter {
    fn filter(&self, cx: &mut CycleContext<'_>, candidates: &mut Vec<Candidate>) {
        let Some(header) = cx.request.header(ENDPOINT_SELECTION_HEADER) else {
            candidates.clear();
            return;
        };
        let wanted: Vec<Wanted> = header.split(',').filter_map(parse).collect();
        candidates.retain(|c| {
            let addr = c.endpoint.addr();
            wanted.iter().any(|w| match w {
                Wanted::Endpoint(a) => *a == addr,
                Wanted::Address(ip) => *ip == addr.ip(),
            })
        });
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use epp_core::{Endpoint, InferenceRequest};

    use super::*;
    use crate::testing::with_cx;

    fn kept(header: Option<&str>) -> Vec<String> {
        let endpoints = [
            "10.0.0.1:8000",
            "10.0.0.1:8001",
            "10.0.0.2:8000",
            "[fd00::3]:8000",
        ];
        let mut candidates: Vec<Candidate> = endpoints
            .iter()
            .enumerate()
            .map(|(i, a)| Candidate::new(&Arc::new(Endpoint::new(i as u32, a.parse().unwrap()))))
            .collect();
        let mut request = InferenceRequest::builder("m");
        if let Some(h) = header {
            request = request.header(ENDPOINT_SELECTION_HEADER, h);
        }
        let request = request.build();
        let filter = HeaderBasedTestingFilter::build("f", NoParams {}).unwrap();
        with_cx(&request, 1, |cx| filter.filter(cx, &mut candidates));
        candidates
            .iter()
            .map(|c| c.endpoint.addr_str().to_owned())
            .collect()
    }

    #[test]
    fn keeps_what_the_header_names() {
        assert_eq!(kept(Some("10.0.0.2:8000")), ["10.0.0.2:8000"]);
        assert_eq!(
            kept(Some("10.0.0.1")),
            ["10.0.0.1:8000", "10.0.0.1:8001"],
            "a bare address keeps every port (rank) of it"
        );
        assert_eq!(
            kept(Some(" 10.0.0.1:8001 , [fd00::3] ,junk")),
            ["10.0.0.1:8001", "[fd00::3]:8000"]
        );
    }

    #[test]
    fn without_a_usable_header_nothing_is_kept() {
        assert!(kept(None).is_empty());
        assert!(kept(Some("")).is_empty());
        assert!(kept(Some("10.0.0.9,10.0.0.2:9999")).is_empty());
    }
}
