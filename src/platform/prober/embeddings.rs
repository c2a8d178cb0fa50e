//! The prober's checks of an embedding model, through OpenAI's
//! `/v1/embeddings` as tenants call it:
//! - **golden vector**: a fixed text's vector, recorded the first time the
//!   prober sees a config version (asked twice, alone; they must agree)
//!   and compared on every later round;
//! - **canary**: sentinel B's texts embedded alone, then again in several
//!   calls at the same time as sentinel A embeds fresh marker texts. The
//!   model packs concurrent calls into shared passes, so each of B's
//!   vectors must still be its own: within cosine 0.9999 of B's vector
//!   alone. A vector computed from A's text in B's answer is a finding.
//!
//! "Equal" is cosine similarity of at least 0.9999: the kernels are
//! deterministic, but a vector computed in another pass may round
//! differently in its last bits.

use super::{Finding, ProbeError, Prober, Sentinel, marker, metrics};
use bulkhead_control_api::ModelView;
use bulkhead_telemetry::KeyValue;
use serde_json::{Value, json};

/// Whether `m` is an embedding model.
pub(super) fn embeds(m: &ModelView) -> bool {
    bulkhead_control_api::is_embedding(&m.task)
}

/// The golden vector's text.
const GOLDEN_TEXT: &str = "The quick brown fox jumps over the lazy dog.";

/// Sentinel B's texts.
const B_TEXTS: [&str; 3] = [
    "A quiet harbour at dawn.",
    "Three apples on a wooden table.",
    "The committee meets every Tuesday.",
];

/// The least cosine similarity two vectors of one text may have.
const SAME: f64 = 0.9999;

fn cosine(a: &[f64], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
    let n = norm(a) * norm(b);
    if n == 0.0 || a.len() != b.len() {
        return 0.0;
    }
    dot / n
}

impl Prober {
    /// The golden vector, then the canary.
    pub(super) async fn embedding_checks(
        &mut self,
        m: &ModelView,
    ) -> Result<Option<Finding>, ProbeError> {
        match self.golden_vector(m).await? {
            None => self.embedding_canary(m).await,
            found => Ok(found),
        }
    }

    /// `texts`' vectors as `who` gets them, and the request id.
    async fn embed(
        &self,
        m: &ModelView,
        who: &Sentinel,
        texts: &[String],
    ) -> Result<(Vec<Vec<f64>>, String), ProbeError> {
        let body = json!({"model": m.slug, "input": texts, "encoding_format": "float"});
        let a = self
            .call("POST", "/v1/embeddings", who, Some(&body))
            .await?;
        let v = a.json()?;
        let bad = ProbeError::Network("bad answer");
        let mut vectors = vec![Vec::new(); texts.len()];
        for d in v["data"].as_array().ok_or(bad)? {
            let i = d["index"].as_u64().and_then(|i| usize::try_from(i).ok());
            let slot = i
                .and_then(|i| vectors.get_mut(i))
                .ok_or(ProbeError::Network("bad answer"))?;
            *slot = d["embedding"]
                .as_array()
                .ok_or(ProbeError::Network("bad answer"))?
                .iter()
                .filter_map(Value::as_f64)
                .collect();
        }
        if vectors.iter().any(Vec::is_empty) {
            return Err(ProbeError::Network("bad answer"));
        }
        Ok((vectors, a.request_id))
    }

    /// The golden text's vector against the one recorded for this config
    /// version.
    async fn golden_vector(&mut self, m: &ModelView) -> Result<Option<Finding>, ProbeError> {
        let version = m.active_config.unwrap_or(0);
        let key = format!("{} v{version} {GOLDEN_TEXT}", m.slug);
        let text = [GOLDEN_TEXT.to_owned()];
        let (got, id) = self.embed(m, &self.a, &text).await?;
        let recorded: Option<Vec<f64>> = self
            .state
            .golden
            .get(&key)
            .and_then(|v| serde_json::from_str(v).ok());
        match recorded {
            Some(want) if cosine(&got[0], &want) >= SAME => {}
            Some(want) => {
                return Ok(Some(Finding {
                    check: "golden_vector",
                    evidence: format!(
                        "request {id}: the golden text's vector changed (cosine {:.6} to the one recorded for config v{version})",
                        cosine(&got[0], &want)
                    ),
                }));
            }
            None => {
                let (again, id2) = self.embed(m, &self.a, &text).await?;
                let c = cosine(&got[0], &again[0]);
                if c < SAME {
                    return Ok(Some(Finding {
                        check: "golden_vector",
                        evidence: format!(
                            "requests {id} and {id2}: one text got two vectors (cosine {c:.6}) while recording config v{version}"
                        ),
                    }));
                }
                let json = serde_json::to_string(&got[0])
                    .map_err(|_| ProbeError::Network("bad answer"))?;
                self.state.golden.insert(key, json);
            }
        }
        metrics()
            .checks
            .add(1, &[KeyValue::new("check", "golden_vector")]);
        Ok(None)
    }

    /// Sentinel B's vectors alone, then beside sentinel A's marker texts.
    async fn embedding_canary(&self, m: &ModelView) -> Result<Option<Finding>, ProbeError> {
        let texts: Vec<String> = B_TEXTS.iter().map(|t| (*t).to_owned()).collect();
        let (alone, _) = self.embed(m, &self.b, &texts).await?;
        let mark = marker();
        let planted: Vec<String> = (0..8)
            .map(|i| format!("{mark} secret record {i} of sentinel A {mark}"))
            .collect();
        let (a, b) = tokio::join!(self.embed(m, &self.a, &planted), async {
            tokio::join!(
                self.embed(m, &self.b, &texts),
                self.embed(m, &self.b, &texts[..1]),
                self.embed(m, &self.b, &texts[1..]),
            )
        });
        let (planted_vectors, a_id) = a?;
        let (whole, first, rest) = b;
        let answers = [(whole?, 0), (first?, 0), (rest?, 1)];
        for ((vectors, b_id), from) in &answers {
            for (k, v) in vectors.iter().enumerate() {
                let own = cosine(v, &alone[from + k]);
                if own >= SAME {
                    continue;
                }
                let nearest = planted_vectors
                    .iter()
                    .map(|p| cosine(v, p))
                    .fold(f64::MIN, f64::max);
                return Ok(Some(Finding {
                    check: "canary_crossed",
                    evidence: format!(
                        "request {b_id}: sentinel B's vector {k} is not its own (cosine {own:.6} to B's text alone, {nearest:.6} to sentinel A's marker texts in request {a_id})"
                    ),
                }));
            }
        }
        metrics()
            .checks
            .add(1, &[KeyValue::new("check", "embedding_canary")]);
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cosine_is_one_for_a_vector_and_zero_for_a_mismatch() {
        assert!((cosine(&[0.6, 0.8], &[0.6, 0.8]) - 1.0).abs() < 1e-12);
        assert_eq!(cosine(&[1.0, 0.0], &[0.0, 1.0]), 0.0);
        assert_eq!(cosine(&[1.0], &[1.0, 0.0]), 0.0);
        assert_eq!(cosine(&[0.0, 0.0], &[1.0, 0.0]), 0.0);
    }
}
