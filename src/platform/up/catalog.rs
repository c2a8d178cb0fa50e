//! The models `up` publishes: each public, with a config that matches what
//! its workers load, a new config version only when it changed.

use super::*;
use bulkhead_control_api::{
    ConfigSpec, CreateModel, KvBudget, ModelSlug, Parallelism, Properties, Timestamp, Visibility,
};
use bulkhead_control_plane::store;
use std::time::Duration;

/// A config for the default model's weights (whose sha256 is given):
/// `quantization` as its workers register it, `properties`, `budget` bytes
/// of KV memory per role, 16-token pages, one device, `up`'s price.
pub(crate) fn config(
    sha256: &str,
    quantization: &str,
    properties: Properties,
    budget: u64,
) -> ConfigSpec {
    ConfigSpec {
        properties,
        weights_file: fetch::FILE_NAME.to_owned(),
        weights_sha256: sha256.to_owned(),
        quantization: quantization.to_owned(),
        page_size: 16,
        kv_budget: KvBudget {
            prefill_bytes: budget,
            decode_bytes: budget,
        },
        parallelism: Parallelism::default(),
        price: PRICE,
    }
}

/// The served models, public, each with a config that matches what its
/// workers load (a new version only when it changed).
pub(super) async fn publish_models(
    c: &mut store::Conn,
    args: &UpArgs,
    now: Timestamp,
) -> anyhow::Result<()> {
    let budget = args.kv_budget_mib << 20;
    for served in args.served() {
        let slug: ModelSlug = served.slug().parse()?;
        let properties = Properties {
            context_window: args.context_window,
            max_output: args.max_output,
        };
        let spec = config(fetch::SHA256, served.quantization, properties, budget);
        let model = NewModel {
            slug,
            task: bulkhead_control_api::GENERATION_TASK,
            description: served.description,
        };
        publish(c, &model, &spec, now).await?;
    }
    Ok(())
}

/// A model `up` publishes, public, when it is not there yet.
pub(super) struct NewModel {
    pub(super) slug: ModelSlug,
    pub(super) task: &'static str,
    pub(super) description: &'static str,
}

/// Publishes `m` (public) unless it exists, and makes `spec` its active
/// config unless it already is.
pub(super) async fn publish(
    c: &mut store::Conn,
    m: &NewModel,
    spec: &ConfigSpec,
    now: Timestamp,
) -> anyhow::Result<()> {
    let model = match store::models::find_optional(&mut *c, &m.slug).await? {
        Some(found) => found,
        None => {
            let create = CreateModel {
                slug: m.slug.clone(),
                task: m.task.to_owned(),
                description: m.description.to_owned(),
                visibility: Visibility::Public,
                config: None,
            };
            store::models::create(&mut *c, &create, now).await?
        }
    };
    let active = store::configs::active(&mut *c, &model).await?;
    if active.as_ref().is_none_or(|a| a.spec != *spec) {
        let v = store::configs::add(&mut *c, &model, spec, "bulkhead up", now).await?;
        // Nodes of a previous run are silent by now or about to be replaced.
        store::configs::activate(
            &mut *c,
            &model,
            v,
            "bulkhead up",
            "bulkhead up",
            now,
            Duration::ZERO,
        )
        .await?;
    }
    Ok(())
}
