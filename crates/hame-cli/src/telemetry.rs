//! What the process reports about itself: warnings (or `HAME_LOG`) on stderr and, with
//! `--otlp-endpoint`, OpenTelemetry traces of calls, steps, model requests and tool calls
//! over OTLP/HTTP (protobuf), batched on a thread of their own.

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry};

use crate::status;

/// Keeps the trace exporter until the process ends; [`Telemetry::shutdown`] flushes it.
#[derive(Default)]
pub(crate) struct Telemetry {
    #[cfg(feature = "otlp")]
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Telemetry {
    /// Sends the spans still buffered (bounded by the exporter's timeout).
    pub(crate) fn shutdown(self) {
        #[cfg(feature = "otlp")]
        if let Some(p) = self.provider
            && let Err(e) = p.shutdown()
        {
            eprintln!("hame: warning: flushing traces failed: {e}");
        }
    }
}

type Boxed = Box<dyn Layer<Registry> + Send + Sync>;

/// The stderr log: `HAME_LOG` set, the full format (time, target) for debugging; else
/// warnings only, one plain line each, no time stamp or module path; on a terminal the
/// retry notices update one line in place. Colour codes only on a terminal.
fn stderr_layer() -> Boxed {
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    match EnvFilter::try_from_env("HAME_LOG") {
        Ok(filter) => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(ansi)
            .with_filter(filter)
            .boxed(),
        Err(_) if ansi => tracing_subscriber::fmt::layer()
            .with_writer(status::TtyWriter)
            .with_ansi(true)
            .without_time()
            .with_target(false)
            .with_filter(EnvFilter::new("warn"))
            .boxed(),
        Err(_) => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .without_time()
            .with_target(false)
            .with_filter(EnvFilter::new("warn"))
            .boxed(),
    }
}

/// The traces endpoint of an OTLP/HTTP URL: a base URL (`http://host:4318`, no path) gets
/// the standard `/v1/traces`; a URL with a path is used as it is.
#[cfg_attr(not(feature = "otlp"), allow(dead_code))]
fn traces_url(endpoint: &str) -> Result<String, String> {
    let e = endpoint.trim();
    let rest = e
        .strip_prefix("http://")
        .or_else(|| e.strip_prefix("https://"))
        .filter(|r| !r.is_empty())
        .ok_or_else(|| {
            format!("--otlp-endpoint {e}: give an OTLP/HTTP URL such as http://127.0.0.1:4318")
        })?;
    Ok(match rest.split_once('/') {
        None | Some((_, "")) => format!("{}/v1/traces", e.trim_end_matches('/')),
        Some(_) => e.to_owned(),
    })
}

/// Installs the subscriber. `otlp`: the collector's OTLP/HTTP endpoint.
pub(crate) fn init(otlp: Option<&str>) -> Result<Telemetry, String> {
    let registry = tracing_subscriber::registry().with(stderr_layer());
    let Some(endpoint) = otlp else {
        registry.init();
        return Ok(Telemetry::default());
    };
    #[cfg(feature = "otlp")]
    {
        use opentelemetry::trace::TracerProvider as _;
        use opentelemetry_otlp::WithExportConfig;
        let url = traces_url(endpoint)?;
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_endpoint(url.clone())
            .with_timeout(std::time::Duration::from_secs(5))
            .build()
            .map_err(|e| format!("--otlp-endpoint {url}: {e}"))?;
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            // Every span is exported: a caller's "not sampled" `traceparent` does not hide
            // its requests from the traces (the trace id is still the caller's).
            .with_sampler(opentelemetry_sdk::trace::Sampler::AlwaysOn)
            .with_resource(
                opentelemetry_sdk::Resource::builder()
                    .with_service_name("hame")
                    .build(),
            )
            .build();
        let tracer = provider.tracer("hame");
        // W3C trace context: `hame serve` continues an incoming `traceparent`; model
        // providers and HTTP MCP servers are sent the current span's.
        opentelemetry::global::set_text_map_propagator(
            opentelemetry_sdk::propagation::TraceContextPropagator::new(),
        );
        // hame's own spans (hame.http, hame.turn, hame.call, hame.step, hame.model,
        // hame.tool), exported with the GenAI names (ADR 0037).
        let spans =
            tracing_subscriber::filter::Targets::new().with_target("hame", tracing::Level::INFO);
        registry
            .with(
                tracing_opentelemetry::layer()
                    .with_tracer(tracer)
                    .with_filter(spans),
            )
            .init();
        Ok(Telemetry {
            provider: Some(provider),
        })
    }
    #[cfg(not(feature = "otlp"))]
    {
        registry.init();
        Err(format!(
            "--otlp-endpoint {endpoint}: this hame was built without the `otlp` feature"
        ))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_base_url_gets_the_traces_path() {
        assert_eq!(
            super::traces_url("http://127.0.0.1:4318").as_deref(),
            Ok("http://127.0.0.1:4318/v1/traces")
        );
        assert_eq!(
            super::traces_url("http://c:4318/").as_deref(),
            Ok("http://c:4318/v1/traces")
        );
        assert_eq!(
            super::traces_url("https://c/custom/path").as_deref(),
            Ok("https://c/custom/path")
        );
        assert!(super::traces_url("127.0.0.1:4318").is_err());
    }
}
