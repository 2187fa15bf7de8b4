//! `header-label-affinity-scorer` (llm-d): prefer endpoints whose label
//! matches a request header.

use epp_core::{BuildError, Candidate, CycleContext, Plugin, Scorer};

use crate::{Builtin, invalid};

/// Parameters of `header-label-affinity-scorer` (both required).
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HeaderLabelAffinityParams {
    /// Request header to read (case-insensitive).
    #[serde(default)]
    pub header_name: String,
    /// Endpoint label compared with the header's value.
    #[serde(default)]
    pub label_key: String,
}

/// `header-label-affinity-scorer`: 1 for candidates whose `labelKey` label
/// equals the request's `headerName` header, else 0; all 0 when the header
/// is absent or empty.
#[derive(Debug, Clone)]
pub struct HeaderLabelAffinityScorer {
    name: String,
    header: String,
    label: String,
}

impl Builtin for HeaderLabelAffinityScorer {
    const TYPE: &'static str = "header-label-affinity-scorer";
    type Params = HeaderLabelAffinityParams;

    /// # Errors
    /// An empty `headerName` or `labelKey`.
    fn build(name: impl Into<String>, p: HeaderLabelAffinityParams) -> Result<Self, BuildError> {
        for (field, v) in [("headerName", &p.header_name), ("labelKey", &p.label_key)] {
            if v.is_empty() {
                return Err(invalid(Self::TYPE, field, "\"\"", "is required"));
            }
        }
        Ok(Self {
            name: name.into(),
            header: p.header_name.to_ascii_lowercase(),
            label: p.label_key,
        })
    }
}

impl Plugin for HeaderLabelAffinityScorer {
    fn type_name(&self) -> &str {
        Self::TYPE
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn as_scorer(&self) -> Option<&dyn Scorer> {
        Some(self)
    }
}

impl Scorer for HeaderLabelAffinityScorer {
    fn score(&self, cx: &CycleContext<'_>, candidates: &[Candidate], out: &mut [f64]) {
        let Some(wanted) = cx.request.header(&self.header).filter(|v| !v.is_empty()) else {
            return;
        };
        for (c, s) in candidates.iter().zip(out.iter_mut()) {
            if c.endpoint.label(&self.label) == Some(wanted) {
                *s = 1.0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use epp_core::InferenceRequest;

    use super::*;
    use crate::testing::{labelled, with_cx};

    #[test]
    fn the_matching_label_scores_one() {
        let c: Vec<Candidate> = ["a", "b", ""]
            .into_iter()
            .zip(0u32..)
            .map(|(v, i)| {
                let labels: &[(&str, &str)] = if v.is_empty() {
                    &[]
                } else {
                    &[("pool/variant", v)]
                };
                Candidate::new(&labelled(i, labels))
            })
            .collect();
        let p: HeaderLabelAffinityParams =
            serde_yaml_ng::from_str("{headerName: X-Variant, labelKey: pool/variant}").unwrap();
        let s = HeaderLabelAffinityScorer::build("h", p).unwrap();
        let score = |req: &InferenceRequest| {
            with_cx(req, 0, |cx| {
                let mut out = vec![0.0; 3];
                s.score(cx, &c, &mut out);
                out
            })
        };
        let req = InferenceRequest::builder("m")
            .header("x-variant", "b")
            .build();
        assert_eq!(score(&req), vec![0.0, 1.0, 0.0]);
        let empty = InferenceRequest::builder("m")
            .header("x-variant", "")
            .build();
        assert_eq!(score(&empty), vec![0.0; 3]);
        let missing = HeaderLabelAffinityParams {
            header_name: "x".into(),
            label_key: String::new(),
        };
        let err = HeaderLabelAffinityScorer::build("h", missing).unwrap_err();
        assert!(err.to_string().contains("labelKey"), "{err}");
    }
}
