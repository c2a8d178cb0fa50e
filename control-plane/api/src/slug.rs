//! Model slugs: `@cf/org/name`, validated once where they enter.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::str::FromStr;

/// A model slug such as `@cf/huggingfacetb/smollm2-135m-instruct`: an `@`
/// namespace, an organisation and a name, each of lowercase letters, digits,
/// `-`, `_` and `.`, at most 128 characters in all.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ModelSlug(String);

/// Why a string is not a model slug.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "`{0}` is not a model slug; expected `@namespace/org/name` in lowercase letters, digits, `-`, `_` and `.`"
)]
pub struct SlugError(pub String);

impl ModelSlug {
    /// The slug as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The slug percent-encoded as one URL path segment (`@cf%2Forg%2Fname`).
    pub fn path_segment(&self) -> String {
        self.0.replace('@', "%40").replace('/', "%2F")
    }
}

impl FromStr for ModelSlug {
    type Err = SlugError;
    fn from_str(s: &str) -> Result<Self, SlugError> {
        let bad = || SlugError(s.chars().take(140).collect());
        if s.len() > 128 {
            return Err(bad());
        }
        let rest = s.strip_prefix('@').ok_or_else(bad)?;
        let parts: Vec<&str> = rest.split('/').collect();
        let ok_part = |p: &str| {
            !p.is_empty()
                && p.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b))
                && p != "."
                && p != ".."
        };
        if parts.len() != 3 || !parts.iter().all(|p| ok_part(p)) {
            return Err(bad());
        }
        Ok(ModelSlug(s.to_owned()))
    }
}

impl fmt::Display for ModelSlug {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Serialize for ModelSlug {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for ModelSlug {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs() {
        for good in ["@cf/huggingfacetb/smollm2-135m-instruct", "@hf/org/m.v1_2"] {
            assert_eq!(good.parse::<ModelSlug>().unwrap().as_str(), good);
        }
        for bad in [
            "",
            "cf/org/name",
            "@cf/org",
            "@cf/org/name/x",
            "@cf//name",
            "@cf/Org/name",
            "@cf/org/na me",
            "@cf/../name",
        ] {
            assert!(bad.parse::<ModelSlug>().is_err(), "{bad}");
        }
        let s: ModelSlug = "@cf/meta/x".parse().unwrap();
        assert_eq!(s.path_segment(), "%40cf%2Fmeta%2Fx");
    }
}
