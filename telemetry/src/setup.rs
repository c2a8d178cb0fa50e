//! [`init`]: providers, exporters and the `tracing` subscriber, once per
//! process, before any port is bound.
//!
//! The OpenTelemetry environment is honoured as the specification names it:
//! `OTEL_SDK_DISABLED=true` exports nothing and samples no trace;
//! `OTEL_TRACES_EXPORTER` and `OTEL_METRICS_EXPORTER` choose `otlp` (the
//! default when an endpoint is set) or `none` (`prometheus` too for metrics,
//! which `/metrics` always serves), so a traces-only backend is not sent
//! metrics every interval; `OTEL_TRACES_SAMPLER` (the specification's six
//! built-in samplers) and `OTEL_TRACES_SAMPLER_ARG` choose the sampler. Any
//! other exporter or sampler name, or a ratio outside 0 to 1, is refused at
//! start, not ignored.
//!
//! Only spans of `bulkhead*` targets at info and above become OpenTelemetry
//! spans, whatever `RUST_LOG` says, so no dependency's span is exported (the
//! exporter's own HTTP client included).

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{MetricExporter, Protocol, SpanExporter, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use std::sync::OnceLock;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, filter};

/// Why telemetry could not start.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// An OTLP exporter could not be built from the environment.
    #[error("OTLP exporter: {0}")]
    Exporter(String),
    /// The Prometheus reader could not be registered.
    #[error("Prometheus registry: {0}")]
    Prometheus(String),
    /// `OTEL_TRACES_SAMPLER` names a sampler this build does not have.
    #[error(
        "OTEL_TRACES_SAMPLER={0} is not supported: use always_on, always_off, traceidratio, \
         parentbased_always_on, parentbased_always_off or parentbased_traceidratio"
    )]
    Sampler(String),
    /// `OTEL_TRACES_SAMPLER_ARG` is not a ratio.
    #[error("OTEL_TRACES_SAMPLER_ARG={0} is not a ratio from 0 to 1")]
    SamplerArg(String),
    /// `RUST_LOG` does not parse.
    #[error("RUST_LOG: {0}")]
    Filter(String),
    /// An `OTEL_*_EXPORTER` this build does not have.
    #[error("{var}={value} is not supported: use otlp or none{also}")]
    ExporterName {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// Other accepted values.
        also: &'static str,
    },
    /// Only http/protobuf is built in.
    #[error(
        "OTEL_EXPORTER_OTLP_PROTOCOL={0} is not supported: this build exports http/protobuf only"
    )]
    Protocol(String),
    /// A subscriber or provider is already installed.
    #[error("telemetry is already set up in this process")]
    AlreadySet,
}

/// The installed providers; [`Telemetry::shutdown`] (or dropping it)
/// flushes what is buffered. Drop it outside any async runtime: the OTLP
/// exporter blocks.
#[derive(Debug)]
pub struct Telemetry {
    tracer: SdkTracerProvider,
    meter: SdkMeterProvider,
    exporting: bool,
}

impl Telemetry {
    /// Whether spans and metrics leave the process over OTLP.
    pub fn exporting(&self) -> bool {
        self.exporting
    }

    /// Flushes and stops the exporters.
    pub fn shutdown(self) {
        drop(self);
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        let _ = self.tracer.force_flush();
        let _ = self.tracer.shutdown();
        let _ = self.meter.shutdown();
    }
}

/// The registry `/metrics` serves, once [`init`] ran.
pub(crate) fn registry() -> Option<&'static prometheus::Registry> {
    REGISTRY.get()
}

static REGISTRY: OnceLock<prometheus::Registry> = OnceLock::new();

static TRACE_POLLS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether routine polls (routing long-polls, heartbeats, health checks,
/// scrapes) are traced: as [`Settings::trace_polls`] said at set-up; not
/// before.
pub fn trace_polls() -> bool {
    TRACE_POLLS.load(std::sync::atomic::Ordering::Relaxed)
}

/// What the environment says about telemetry: the OpenTelemetry SDK's
/// variables and Bulkhead's own, read once by the binary (this crate reads
/// no environment itself).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settings {
    /// `OTEL_EXPORTER_OTLP_PROTOCOL`.
    pub otlp_protocol: Option<String>,
    /// `OTEL_SDK_DISABLED=true`.
    pub sdk_disabled: bool,
    /// `OTEL_TRACES_EXPORTER`.
    pub traces_exporter: String,
    /// `OTEL_TRACES_SAMPLER`, when set and not empty.
    pub traces_sampler: Option<String>,
    /// `OTEL_TRACES_SAMPLER_ARG`, when set and not empty.
    pub traces_sampler_arg: Option<String>,
    /// `OTEL_METRICS_EXPORTER`.
    pub metrics_exporter: String,
    /// An OTLP endpoint for traces is set (the signal's or the shared one).
    pub traces_endpoint: bool,
    /// An OTLP endpoint for metrics is set.
    pub metrics_endpoint: bool,
    /// `RUST_LOG`, when set and not empty.
    pub log_filter: Option<String>,
    /// `BULKHEAD_LOG_FORMAT=json`.
    pub json_logs: bool,
    /// `BULKHEAD_TRACE_POLLS=true` (or `1`): routine polls are traced.
    pub trace_polls: bool,
}

impl Settings {
    /// The settings the variables give, each looked up with `var` (the
    /// binary passes the process environment's).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Settings {
        let set = |k: &str| var(k).is_some_and(|s| !s.is_empty());
        Settings {
            otlp_protocol: var("OTEL_EXPORTER_OTLP_PROTOCOL"),
            sdk_disabled: var("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")),
            traces_exporter: var("OTEL_TRACES_EXPORTER").unwrap_or_default(),
            traces_sampler: var("OTEL_TRACES_SAMPLER").filter(|s| !s.is_empty()),
            traces_sampler_arg: var("OTEL_TRACES_SAMPLER_ARG").filter(|s| !s.is_empty()),
            metrics_exporter: var("OTEL_METRICS_EXPORTER").unwrap_or_default(),
            traces_endpoint: set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
                || set("OTEL_EXPORTER_OTLP_ENDPOINT"),
            metrics_endpoint: set("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
                || set("OTEL_EXPORTER_OTLP_ENDPOINT"),
            log_filter: var("RUST_LOG").filter(|s| !s.is_empty()),
            json_logs: var("BULKHEAD_LOG_FORMAT").is_some_and(|f| f == "json"),
            trace_polls: var("BULKHEAD_TRACE_POLLS").is_some_and(|v| v == "true" || v == "1"),
        }
    }
}

/// Sets up traces, metrics and logs for `service` (`service.name`) running
/// as `instance` (`service.instance.id`) as `settings` say; logs at `info`
/// unless `RUST_LOG` said otherwise.
pub fn init(
    service: &'static str,
    instance: &str,
    settings: &Settings,
) -> Result<Telemetry, TelemetryError> {
    init_with_logs(
        service,
        instance,
        "info,opentelemetry=warn,opentelemetry_sdk=warn",
        settings,
    )
}

/// [`init`], with `default_logs` as the log filter when `RUST_LOG` is unset.
pub fn init_with_logs(
    service: &'static str,
    instance: &str,
    default_logs: &str,
    settings: &Settings,
) -> Result<Telemetry, TelemetryError> {
    if let Some(p) = &settings.otlp_protocol
        && p != "http/protobuf"
    {
        return Err(TelemetryError::Protocol(p.clone()));
    }
    TRACE_POLLS.store(settings.trace_polls, std::sync::atomic::Ordering::Relaxed);
    let resource = Resource::builder()
        .with_service_name(service)
        .with_attributes([
            opentelemetry::KeyValue::new("service.instance.id", instance.to_owned()),
            opentelemetry::KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
        ])
        .build();
    let (traces, metrics) = exports(settings)?;
    let tracer = tracer_provider(resource.clone(), sampler(settings)?, traces)?;
    let meter = meter_provider(resource, metrics)?;
    let filter = EnvFilter::try_new(settings.log_filter.as_deref().unwrap_or(default_logs))
        .map_err(|e| TelemetryError::Filter(e.to_string()))?;
    let json = settings.json_logs;
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(false);
    let fmt = if json {
        fmt.json()
            .with_current_span(true)
            .with_span_list(false)
            .boxed()
    } else {
        fmt.boxed()
    };
    // Spans of our own crates at info and above become OpenTelemetry spans
    // whatever RUST_LOG says; dependencies' spans (the exporter's own HTTP
    // client among them) never do.
    let otel = tracing_opentelemetry::layer()
        .with_tracer(tracer.tracer("bulkhead"))
        .with_filter(filter::filter_fn(|m| {
            m.target().starts_with("bulkhead") && *m.level() <= tracing::Level::INFO
        }));
    tracing_subscriber::registry()
        .with(fmt.with_filter(filter))
        .with(otel)
        .try_init()
        .map_err(|_| TelemetryError::AlreadySet)?;
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    opentelemetry::global::set_tracer_provider(tracer.clone());
    opentelemetry::global::set_meter_provider(meter.clone());
    Ok(Telemetry {
        tracer,
        meter,
        exporting: traces || metrics,
    })
}

/// Whether traces and metrics go out over OTLP.
fn exports(settings: &Settings) -> Result<(bool, bool), TelemetryError> {
    let disabled = settings.sdk_disabled;
    let traces = exporter_wanted(
        "OTEL_TRACES_EXPORTER",
        &settings.traces_exporter,
        settings.traces_endpoint,
        &[],
    )? && !disabled;
    let metrics = exporter_wanted(
        "OTEL_METRICS_EXPORTER",
        &settings.metrics_exporter,
        settings.metrics_endpoint,
        &["prometheus"],
    )? && !disabled;
    Ok((traces, metrics))
}

/// An OTLP exporter of the given type over HTTP with protobuf bodies, its
/// endpoint and headers from the standard `OTEL_EXPORTER_OTLP_*` variables.
/// (The span and metric exporters' builders share no trait to be generic
/// over.)
macro_rules! otlp_http {
    ($exporter:ident) => {
        $exporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .build()
            .map_err(|e| TelemetryError::Exporter(e.to_string()))
    };
}

/// The tracer provider, sampling as `sampler` says, with an OTLP exporter
/// when traces go out.
fn tracer_provider(
    resource: Resource,
    sampler: Sampler,
    traces: bool,
) -> Result<SdkTracerProvider, TelemetryError> {
    let mut tracer = SdkTracerProvider::builder()
        .with_resource(resource)
        .with_sampler(sampler);
    if traces {
        tracer = tracer.with_batch_exporter(otlp_http!(SpanExporter)?);
    }

    Ok(tracer.build())
}

/// The meter provider: Prometheus for `/metrics` always, OTLP when metrics
/// go out.
fn meter_provider(resource: Resource, metrics: bool) -> Result<SdkMeterProvider, TelemetryError> {
    let registry = prometheus::Registry::new();
    let prometheus = opentelemetry_prometheus::exporter()
        .with_registry(registry.clone())
        .build()
        .map_err(|e| TelemetryError::Prometheus(e.to_string()))?;
    let mut meter = SdkMeterProvider::builder()
        .with_resource(resource)
        .with_reader(prometheus);
    if metrics {
        meter = meter.with_periodic_exporter(otlp_http!(MetricExporter)?);
    }
    REGISTRY
        .set(registry)
        .map_err(|_| TelemetryError::AlreadySet)?;
    Ok(meter.build())
}

/// Whether a signal goes out over OTLP: as `var`'s `value` says (`otlp`,
/// `none`, or one of `pull`, which `/metrics` serves), else when an
/// endpoint is set.
fn exporter_wanted(
    var: &'static str,
    value: &str,
    endpoint_set: bool,
    pull: &[&str],
) -> Result<bool, TelemetryError> {
    let mut otlp = false;
    for name in value.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        match name {
            "otlp" => otlp = true,
            "none" => {}
            n if pull.contains(&n) => {}
            _ => {
                return Err(TelemetryError::ExporterName {
                    var,
                    value: value.to_owned(),
                    also: if pull.is_empty() {
                        ""
                    } else {
                        " or prometheus"
                    },
                });
            }
        }
    }
    if value.trim().is_empty() {
        return Ok(endpoint_set);
    }
    Ok(otlp)
}

/// The sampler the settings name, as the OpenTelemetry specification
/// defines `OTEL_TRACES_SAMPLER` (default `parentbased_always_on`); nothing
/// is sampled when the SDK is disabled.
fn sampler(settings: &Settings) -> Result<Sampler, TelemetryError> {
    if settings.sdk_disabled {
        return Ok(Sampler::AlwaysOff);
    }
    let name = settings
        .traces_sampler
        .as_deref()
        .unwrap_or("parentbased_always_on");
    let ratio = || -> Result<f64, TelemetryError> {
        let Some(arg) = settings.traces_sampler_arg.as_deref() else {
            return Ok(1.0);
        };
        match arg.trim().parse::<f64>() {
            Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
            _ => Err(TelemetryError::SamplerArg(arg.to_owned())),
        }
    };
    Ok(match name.trim() {
        "always_on" => Sampler::AlwaysOn,
        "always_off" => Sampler::AlwaysOff,
        "traceidratio" => Sampler::TraceIdRatioBased(ratio()?),
        "parentbased_always_on" => Sampler::ParentBased(Box::new(Sampler::AlwaysOn)),
        "parentbased_always_off" => Sampler::ParentBased(Box::new(Sampler::AlwaysOff)),
        "parentbased_traceidratio" => {
            Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(ratio()?)))
        }
        other => return Err(TelemetryError::Sampler(other.to_owned())),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{Span as _, Tracer as _};

    /// Whether a root span records, under the sampler `vars` choose.
    fn recorded(vars: &[(&str, &str)]) -> Result<bool, TelemetryError> {
        Ok(recorded_both(vars)?.0)
    }

    /// Whether a root span records, and whether a span under a remote
    /// parent that was not sampled does.
    fn recorded_both(vars: &[(&str, &str)]) -> Result<(bool, bool), TelemetryError> {
        use opentelemetry::trace::{
            SpanContext, SpanId, TraceContextExt as _, TraceFlags, TraceId,
        };
        let settings = Settings::from_vars(|k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| (*v).to_owned())
        });
        let provider = tracer_provider(Resource::builder().build(), sampler(&settings)?, false)?;
        let tracer = provider.tracer("test");
        let root = tracer.start("a root span").is_recording();
        let unsampled = SpanContext::new(
            TraceId::from_bytes([7; 16]),
            SpanId::from_bytes([7; 8]),
            TraceFlags::default(),
            true,
            Default::default(),
        );
        let parent = opentelemetry::Context::new().with_remote_span_context(unsampled);
        let child = tracer.start_with_context("a child", &parent).is_recording();
        Ok((root, child))
    }

    #[test]
    fn the_sdk_switch_and_the_sampler_variables_decide_what_is_recorded() {
        // parentbased_always_on by default: a root is sampled, a child
        // follows its parent's decision.
        assert_eq!(recorded_both(&[]).unwrap(), (true, false));
        assert_eq!(
            recorded_both(&[("OTEL_TRACES_SAMPLER", "always_on")]).unwrap(),
            (true, true)
        );
        let parent_ratio = [
            ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "1"),
        ];
        assert_eq!(recorded_both(&parent_ratio).unwrap(), (true, false));
        let parent_ratio = [
            ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "0"),
        ];
        assert_eq!(recorded_both(&parent_ratio).unwrap(), (false, false));
        assert!(!recorded(&[("OTEL_SDK_DISABLED", "true")]).unwrap());
        assert!(
            !recorded(&[
                ("OTEL_SDK_DISABLED", "TRUE"),
                ("OTEL_TRACES_SAMPLER", "always_on")
            ])
            .unwrap()
        );
        assert!(recorded(&[("OTEL_SDK_DISABLED", "false")]).unwrap());
        assert!(!recorded(&[("OTEL_TRACES_SAMPLER", "always_off")]).unwrap());
        assert!(!recorded(&[("OTEL_TRACES_SAMPLER", "parentbased_always_off")]).unwrap());
        let ratio = |arg| {
            recorded(&[
                ("OTEL_TRACES_SAMPLER", "traceidratio"),
                ("OTEL_TRACES_SAMPLER_ARG", arg),
            ])
        };
        assert!(!ratio("0").unwrap());
        assert!(ratio("1").unwrap());
        assert_eq!(
            ratio("2").unwrap_err().to_string(),
            "OTEL_TRACES_SAMPLER_ARG=2 is not a ratio from 0 to 1"
        );
        let e = recorded(&[("OTEL_TRACES_SAMPLER", "jaeger_remote")]).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("OTEL_TRACES_SAMPLER=jaeger_remote is not supported"),
            "{e}"
        );
        // Disabled, nothing goes out whatever the exporters say.
        let off = Settings {
            sdk_disabled: true,
            traces_endpoint: true,
            metrics_endpoint: true,
            ..Settings::default()
        };
        assert_eq!(exports(&off).unwrap(), (false, false));
        let on = Settings {
            sdk_disabled: false,
            ..off
        };
        assert_eq!(exports(&on).unwrap(), (true, true));
    }

    #[test]
    fn the_exporter_variables_choose_otlp_or_nothing() {
        let m = "OTEL_METRICS_EXPORTER";
        // Unset: export when an endpoint is set.
        assert!(exporter_wanted(m, "", true, &["prometheus"]).unwrap());
        assert!(!exporter_wanted(m, "", false, &["prometheus"]).unwrap());
        // `none` and the pull exporter win over the endpoint.
        assert!(!exporter_wanted(m, "none", true, &["prometheus"]).unwrap());
        assert!(!exporter_wanted(m, "prometheus", true, &["prometheus"]).unwrap());
        assert!(exporter_wanted(m, "prometheus, otlp", false, &["prometheus"]).unwrap());
        // Traces have no pull exporter; unknown names are refused, naming
        // the variable.
        let e = exporter_wanted("OTEL_TRACES_EXPORTER", "zipkin", true, &[]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "OTEL_TRACES_EXPORTER=zipkin is not supported: use otlp or none"
        );
        assert!(exporter_wanted("OTEL_TRACES_EXPORTER", "prometheus", true, &[]).is_err());
    }
}
